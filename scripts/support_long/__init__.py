"""Building blocks of scripts/make_support_long_data.py (Python standard library only).

pools.py: entity pools (train/eval disjoint), ids, user noise; logs.py: fake logs, configs,
stack traces, knowledge-base articles; intents.py: the troubleshooting content per intent;
evidence.py: evidence and tool results of a given size; dialogues.py: assembles one conversation.
check_templates.py, measure.py and tokdirs.py are separate tools that need transformers (not used
by the generator).
"""
