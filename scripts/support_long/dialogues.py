"""Assembles one conversation: tool rows (the assistant fetches logs, accounts, tickets or
knowledge-base articles) and plain rows (the user pastes logs, configs, traces or e-mails)."""

import json

from . import evidence as ev
from .intents import INTENTS
from .pools import APP, COMPANY, SUPPORT_EMAIL, Person, call_id, noisy

TOOL_SCHEMAS = {
    "search_knowledge_base": ("Search the support articles; returns matching articles with their text.",
                              {"query": {"type": "string"}}, ["query"]),
    "get_device_logs": ("Fetch a router's system log.",
                        {"device_id": {"type": "string", "description": "Router serial, e.g. HX5-0A1B2C3D."},
                         "since": {"type": "string", "description": "Start date, YYYY-MM-DD."}}, ["device_id", "since"]),
    "get_ticket_history": ("List a customer's support tickets.",
                           {"customer_id": {"type": "string", "description": "Customer ID, e.g. LK-123456."}}, ["customer_id"]),
    "get_account": ("A customer's subscription and payments.",
                    {"customer_id": {"type": "string", "description": "Customer ID, e.g. LK-123456."}}, ["customer_id"]),
}


def schema(name):
    desc, props, req = TOOL_SCHEMAS[name]
    return {"type": "function", "function": {"name": name, "description": desc,
                                             "parameters": {"type": "object", "properties": props, "required": req}}}


SYSTEM_TOOLS = [
    "You are the support assistant of {company}, maker of Larkspur routers and mesh satellites and the {app} app. Use the tools to look up logs, accounts and articles; state only what the customer or a tool told you.",
    "You help {company} customers with their routers, the {app} app and Larkspur Shield. Check logs or the knowledge base before giving a diagnosis, and explain your reasoning step by step.",
    "Larkspur support assistant. Tools: knowledge base, device logs, tickets, accounts. Never ask for passwords. Escalate to {email} if you cannot solve the problem.",
]
SYSTEM_PLAIN = [
    "You are the support assistant of {company} (Larkspur routers, mesh satellites, the {app} app). Work through problems step by step and base conclusions only on what the customer shows you.",
    "You help customers of {company} troubleshoot their home and small-office networks. Be precise and quote the log lines you rely on.",
    "Larkspur help desk. Explain clearly, one step at a time. Never ask for passwords or private keys.",
    None,
]
ASK_EVIDENCE = {
    "syslog": "Could you export the router log and paste it here? In the {app} app: Settings > Diagnostics > Export log (or System > Log in the web interface at http://192.168.1.1).",
    "json": "Could you paste the app's event log? In the {app} app: Settings > Diagnostics > App events > Copy.",
    "config": "Could you paste the relevant configuration? Please replace any passwords or private keys before you paste it.",
    "trace": "Could you paste the full error output of the failing run, including the stack trace?",
    "speedtest": "Could you run a few speed tests (one wired next to the router, one on Wi-Fi where it is slow) and paste the results, together with the router log?",
    "account": "Could you forward the e-mails you received from us about these charges? Please remove full card numbers.",
    "tickets": "Could you paste the e-mails you received from us about the export?",
}
ASK_SPEEDTEST = "Could you run a few speed tests (one wired next to the router, one on Wi-Fi where it is slow) and paste the results?"
PASTE_INTRO = ["here's the log:", "Here you go:", "pasting it below", "This is what I got:", "Here it is (shortened a bit):",
               "ok, copied from the app:", "Below. Sorry it's long.", "see below"]
ACKS = ["Thanks for the details.", "Thanks, that helps.", "Sorry for the trouble, let's sort this out.", "Thanks for pasting that.",
        "I understand how annoying that is.", "Let's look at this together."]
REASON_INTRO = ["Here's what I see, step by step:", "Going through it:", "Let me walk through what this shows.",
                "Looking at it in order:"]
FIX_INTRO = ["What to do:", "To fix it:", "Here's how to fix it:", "Next steps:"]
CLOSINGS = ["Let me know how it goes.", "Tell me if anything in those steps doesn't match what you see.", "If it happens again, note the time and send it to me.", ""]
GENERIC_FOLLOWUPS = [
    ("thanks!", "You're welcome. Is there anything else I can help with?"),
    ("Is there a phone number I can call instead?", "You can reach {company} support at {phone} or {email}; mention your customer ID so that they can find this conversation."),
    ("ok", "Great. I'm here if you need anything else."),
    ("Thanks, that was really clear.", "Glad it helped. Have a good day!"),
]
NEED_ID = "To look at your router I need its serial number (on the label underneath, or in the {app} app under Settings > About) or your customer ID."
NEED_CID = "Could you give me your customer ID? It starts with LK- and is in the {app} app under Account > Profile, and on every invoice."
CID_REPLY = ["its {cid}", "Customer ID {cid}", "{cid}", "Sure: {cid}."]
ID_REPLY = ["serial is {serial}", "It's {serial}.", "Customer ID {cid}, router serial {serial}", "{serial} i think", "Here: {serial}"]


LONG = 25  # evidence size from which the user pastes only after the assistant asked for it


def geometric(rng, p, cap):
    k = 0
    while k < cap and rng.random() > p:
        k += 1
    return k


def assistant_answer(rng, it, cause, F, kb_cited):
    why = cause["why"].format(**F)
    steps = [s.format(**F) for s in cause["steps"]]
    parts = ([rng.choice(ACKS)] if rng.random() < 0.4 else []) + [rng.choice(REASON_INTRO), why]
    if kb_cited:
        parts.append("%s in %s (%s):" % (rng.choice(["This matches the steps", "The fix is described"]), it["kb"][0], it["kb"][1]))
    else:
        parts.append(rng.choice(FIX_INTRO))
    text = "\n\n".join(parts) + "\n" + "\n".join("%d. %s" % (i + 1, s) for i, s in enumerate(steps))
    closing = rng.choice(CLOSINGS)
    return text + ("\n\n" + closing if closing else "")


def evidence_for(rng, p, it, cause, F, n):
    kind = it["evidence"]
    if kind == "syslog":
        return ev.syslog_evidence(rng, p, it, cause, F, n)
    if kind == "json":
        return ev.json_evidence(rng, p, it, cause, F, n)
    if kind == "config":
        return ev.config_evidence(rng, p, it, cause, F, n)
    if kind == "trace":
        return ev.trace_evidence(rng, p, it, cause, F, n)
    if kind == "speedtest":
        csv, log = ev.speedtest_evidence(rng, p, it, cause, F, n)
        return csv + "\n\nrouter log:\n" + log
    return ev.email_thread(rng, p, it, cause, F, n)


class Row:
    def __init__(self, rng, p, with_tools):
        self.rng, self.p, self.msgs, self.tools = rng, p, [], []
        self.with_tools = with_tools

    def add(self, role, content):
        self.msgs.append({"role": role, "content": content})

    def call(self, name, args, result):
        cid = call_id(self.rng)
        if name not in self.tools:
            self.tools.append(name)
        self.msgs.append({"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "id": cid, "function": {"name": name, "arguments": args}}]})
        self.msgs.append({"role": "tool", "tool_call_id": cid, "name": name, "content": result})


def build(rng, split, pools, size, n_follow, with_tools, style, weights=None):
    p = Person(rng, pools)
    it = rng.choice(INTENTS) if weights is None else rng.choices(INTENTS, weights)[0]
    cause = rng.choice(it["causes"])
    F = ev.make_F(rng, p, it)
    F.update(company=COMPANY, email=SUPPORT_EMAIL, phone="+1 " + p.phone, serial=p.serial, cid=p.customer_id)
    ops = [o for i, o in enumerate(it["openers"]) if (i % 4 == 3) == (split == "eval")]
    opener = noisy(rng, rng.choice(ops).format(**F), style)
    row = Row(rng, p, with_tools)
    sysp = rng.choice(SYSTEM_TOOLS if with_tools else SYSTEM_PLAIN)
    if sysp and rng.random() < 0.5:
        row.add("system", sysp.format(company=COMPANY, app=APP, email=SUPPORT_EMAIL))
    kind = it["evidence"]
    if size == 0 and with_tools:  # short row: an article instead of evidence
        row.add("user", opener)
        row.call("search_knowledge_base", {"query": it["kb"][1].lower()}, ev.kb_search_result(rng, it, cause, F, 0, []))
        row.add("assistant", "%s I can't see your setup from here, but %s (%s) covers this.\n\nIts steps:\n%s\n\nIf that doesn't help: %s" % (
            rng.choice(ACKS), it["kb"][0], it["kb"][1],
            "\n".join("%d. %s" % (i + 1, s.format(**F)) for i, s in enumerate(it["kb_steps"] or cause["steps"])), ASK_EVIDENCE[kind].format(**F)))
    elif size == 0:  # short row: no evidence, a general checklist
        row.add("user", opener)
        kb = it["kb"]
        steps = [s.format(**F) for s in it["kb_steps"] or [c["steps"][0] for c in it["causes"]]]
        row.add("assistant", "%s %s\n\n%s\n\n%s\n%s\n\n%s" % (
            rng.choice(ACKS), "Without a log I can't tell which cause applies, so here are the usual ones.", kb[2],
            "Quick checks:", "\n".join("- " + s for s in steps), ASK_EVIDENCE[kind].format(**F)))
    elif with_tools:
        tool_flow(rng, row, p, it, cause, F, opener, size, style)
    else:
        plain_flow(rng, row, p, it, cause, F, opener, size, style)
    fol = list(it["followups"]) + GENERIC_FOLLOWUPS
    for u, a in rng.sample(fol, min(n_follow, len(fol))):
        if with_tools and size and kind == "syslog" and rng.random() < 0.3:
            row.add("user", noisy(rng, rng.choice(["I did all the steps. Can you check the log again?", "done, does the log look better now?",
                                                   "Changed it last night, can you check?"]), style))
            clock = ev.logs.Clock(rng)
            since = clock.date()
            log, _ = ev.logs.syslog(rng, p, max(4, size // 3), [], clock)
            row.call("get_device_logs", {"device_id": p.serial, "since": since}, log)
            row.add("assistant", "The new log has %d lines and none of them is the line I pointed out before; the router looks healthy since the change. %s"
                    % (log.count("\n") + 1, rng.choice(CLOSINGS)))
            continue
        row.add("user", noisy(rng, u.format(**F), style))
        row.add("assistant", a.format(**F))
    out = {"messages": row.msgs}
    if row.tools:
        names = list(row.tools)
        spare = [t for t in TOOL_SCHEMAS if t not in names]
        if rng.random() < 0.15:
            names.append(rng.choice(spare))
        out = {"messages": row.msgs, "tools": [schema(n) for n in sorted(names)]}
    return out, it["key"]


def tool_flow(rng, row, p, it, cause, F, opener, size, style):
    kind = it["evidence"]
    if kind in ("config", "trace"):  # the user pastes; the assistant looks up the article
        paste = "```\n%s\n```" % evidence_for(rng, p, it, cause, F, size)
        if size >= LONG:  # a reply before the long paste: right truncation keeps a trained token
            row.add("user", opener)
            row.add("assistant", ASK_EVIDENCE[kind].format(**F))
            row.add("user", "%s\n\n%s" % (noisy(rng, rng.choice(PASTE_INTRO), style), paste))
        else:
            row.add("user", "%s\n\n%s" % (opener, paste))
        query = it["kb"][1].lower() + (" " + p.model if kind == "config" else "")
        others = rng.sample([o for o in INTENTS if o is not it], min(3, size // 70))
        row.call("search_knowledge_base", {"query": query}, ev.kb_search_result(rng, it, cause, F, size // 8, others))
        row.add("assistant", assistant_answer(rng, it, cause, F, True))
        return
    by_cid = kind in ("account", "tickets")
    if kind == "speedtest":
        csv, log = ev.speedtest_evidence(rng, p, it, cause, F, size)
        if size >= LONG:
            row.add("user", opener)
            row.add("assistant", ASK_SPEEDTEST)
            opener = "%s\n\n```\n%s\n```" % (noisy(rng, rng.choice(PASTE_INTRO), style), csv)
        else:
            opener += "\n\n```\n%s\n```" % csv
    if rng.random() < 0.35:
        row.add("user", opener)
        row.add("assistant", (NEED_CID if by_cid else NEED_ID).format(**F))
        row.add("user", noisy(rng, rng.choice(CID_REPLY if by_cid else ID_REPLY).format(**F), style))
    else:
        tail = ["My customer ID is {cid}.", "Customer ID: {cid}.", "ID {cid}"] if by_cid else \
            ["My customer ID is {cid}, router serial {serial}.", "(serial {serial})", "Router serial: {serial}"]
        row.add("user", opener + " " + noisy(rng, rng.choice(tail).format(**F), style))
    if by_cid:
        name = "get_account" if kind == "account" else "get_ticket_history"
        res = ev.account_json(rng, p, cause, F, size) if kind == "account" else ev.tickets_json(rng, p, cause, F, size)
        row.call(name, {"customer_id": p.customer_id}, res)
    else:
        clock = ev.logs.Clock(rng)
        since = clock.date()
        if kind == "speedtest":
            res = log
        elif kind == "syslog":
            res = ev.syslog_evidence(rng, p, it, cause, F, size, clock)
        else:
            res = ev.json_evidence(rng, p, it, cause, F, size)
        row.call("get_device_logs", {"device_id": p.serial, "since": since}, res)
    kb_cited = rng.random() < 0.2
    if kb_cited:
        others = rng.sample([o for o in INTENTS if o is not it], min(3, size // 80))
        row.call("search_knowledge_base", {"query": it["kb"][1].lower()}, ev.kb_search_result(rng, it, cause, F, size // 10, others))
    row.add("assistant", assistant_answer(rng, it, cause, F, kb_cited))


def plain_flow(rng, row, p, it, cause, F, opener, size, style):
    kind = it["evidence"]
    evid = evidence_for(rng, p, it, cause, F, size)
    fence = "```\n%s\n```" % evid if kind not in ("account", "tickets") else evid
    if size < LONG and rng.random() < 0.7:
        row.add("user", "%s %s\n\n%s" % (opener, noisy(rng, rng.choice(PASTE_INTRO), style), fence))
    else:
        row.add("user", opener)
        row.add("assistant", ASK_EVIDENCE[kind].format(**F))
        row.add("user", "%s\n\n%s" % (noisy(rng, rng.choice(PASTE_INTRO), style), fence))
    row.add("assistant", assistant_answer(rng, it, cause, F, False))


def canonical(row):
    return json.dumps(row, ensure_ascii=False, sort_keys=True)
