"""OpenAI's own Python client against `lora-ft serve` (run by tests/serve.rs):
chat (whole and streamed), text completions, a tool-calling loop, and the client's errors.

    python3 openai_client.py BASE_URL API_KEY MODEL
"""

import json
import sys

import openai

base_url, api_key, model = sys.argv[1:4]
client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=120)

# the model is listed
models = [m.id for m in client.models.list().data]
assert model in models, models

# chat, whole and streamed: the streamed pieces make the same greedy text
messages = [{"role": "system", "content": "You help customers."}, {"role": "user", "content": "Hello!"}]
reply = client.chat.completions.create(model=model, messages=messages, max_tokens=6, temperature=0)
choice = reply.choices[0]
assert choice.message.role == "assistant", choice
assert isinstance(choice.message.content, str), choice
assert choice.finish_reason in ("stop", "length"), choice
assert reply.usage.completion_tokens <= 6 and reply.usage.prompt_tokens > 0, reply.usage
assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
pieces, finish, usage = [], None, None
stream = client.chat.completions.create(
    model=model, messages=messages, max_tokens=6, temperature=0, stream=True,
    stream_options={"include_usage": True},
)
for chunk in stream:
    if chunk.usage is not None:
        usage = chunk.usage
    for c in chunk.choices:
        pieces.append(c.delta.content or "")
        finish = c.finish_reason or finish
assert "".join(pieces) == choice.message.content, (pieces, choice.message.content)
assert finish == choice.finish_reason, finish
assert usage is not None and usage.completion_tokens == reply.usage.completion_tokens, usage
print(f"chat: {choice.message.content!r} ({choice.finish_reason}); streamed in {len(pieces)} pieces")

# text completions, two prompts, two samples each with a seed: four choices
done = client.completions.create(
    model=model, prompt=["Once upon a time", "Dear customer"], max_tokens=4, n=2, seed=3, temperature=1.0,
)
assert [c.index for c in done.choices] == [0, 1, 2, 3], done.choices
assert all(isinstance(c.text, str) for c in done.choices)
print(f"completions: {[c.text for c in done.choices]!r}")

# a tool-calling loop: tools sent; each reply's calls answered by a local function, until the
# model answers in text (at most 3 rounds)
tools = [{
    "type": "function",
    "function": {
        "name": "lookup_order",
        "description": "Look up an order.",
        "parameters": {
            "type": "object",
            "properties": {"order_id": {"type": "string"}},
            "required": ["order_id"],
        },
    },
}]


def lookup_order(order_id):
    return {"order_id": order_id, "status": "shipped"}


# the history holds two calls and their results already, as an app sends them back; asked of a
# third order, the demo model calls the tool itself
def call(order_id, call_id):
    return {"role": "assistant", "content": None, "tool_calls": [{
        "id": call_id, "type": "function",
        "function": {"name": "lookup_order", "arguments": json.dumps({"order_id": order_id})},
    }]}


conversation = [
    {"role": "user", "content": "Where is order FH-2454879?"}, call("FH-2454879", "call_1"),
    {"role": "tool", "tool_call_id": "call_1", "content": json.dumps({"status": "shipped"})},
    {"role": "assistant", "content": "It shipped."},
    {"role": "user", "content": "Where is order FH-3333333?"}, call("FH-3333333", "call_2"),
    {"role": "tool", "tool_call_id": "call_2", "content": json.dumps({"status": "shipped"})},
    {"role": "assistant", "content": "It shipped."},
    {"role": "user", "content": "Where is order FH-1111111?"},
]
calls_made = []
for round in range(3):
    reply = client.chat.completions.create(
        model=model, messages=conversation, tools=tools, tool_choice="auto", max_tokens=40, temperature=0,
    )
    message = reply.choices[0].message
    if not message.tool_calls:
        assert isinstance(message.content, str), message
        assert reply.choices[0].finish_reason in ("stop", "length")
        break
    assert reply.choices[0].finish_reason == "tool_calls", reply.choices[0]
    conversation.append(message.model_dump(exclude_none=True))
    for tool_call in message.tool_calls:
        assert tool_call.type == "function" and tool_call.id.startswith("call_"), tool_call
        arguments = json.loads(tool_call.function.arguments)
        calls_made.append((tool_call.function.name, arguments))
        known = tool_call.function.name == "lookup_order" and set(arguments) == {"order_id"}
        result = lookup_order(**arguments) if known else {"error": "unknown function or arguments"}
        conversation.append({"role": "tool", "tool_call_id": tool_call.id, "content": json.dumps(result)})
assert calls_made[:1] == [("lookup_order", {"order_id": "FH-1111111"})], calls_made
print(f"tools: {round + 1} round(s), calls {calls_made}, last reply {message.content!r}")

# tool_choice "none": the tools stay in the prompt, the reply is all content
reply = client.chat.completions.create(
    model=model, messages=conversation, tools=tools, tool_choice="none", max_tokens=8, temperature=0,
)
assert reply.choices[0].message.tool_calls is None and isinstance(reply.choices[0].message.content, str)
assert reply.choices[0].finish_reason in ("stop", "length"), reply.choices[0]

# tool_choice "required": the reply is a call of a tool, its arguments of the tool's schema
reply = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "Where is order FH-7777777?"}],
    tools=tools, tool_choice="required", max_tokens=60, temperature=0,
)
assert reply.choices[0].finish_reason == "tool_calls", reply.choices[0]
required = reply.choices[0].message.tool_calls
assert required and all(c.function.name == "lookup_order" for c in required), required
assert all(isinstance(json.loads(c.function.arguments)["order_id"], str) for c in required), required
print(f"tool_choice required: {[(c.function.name, c.function.arguments) for c in required]}")

# errors: a bad field is a BadRequestError naming it; a wrong key an AuthenticationError;
# a named tool_choice that is not a tool is refused; an unknown model is a NotFoundError
try:
    client.chat.completions.create(model=model, messages=messages, temperature=-1)
    raise AssertionError("temperature -1 was accepted")
except openai.BadRequestError as e:
    assert e.status_code == 400 and e.param == "temperature", (e.status_code, e.param, e.body)
try:
    client.chat.completions.create(
        model=model, messages=messages, tools=tools, tool_choice={"type": "function", "function": {"name": "nope"}},
    )
    raise AssertionError("a tool_choice naming no tool was accepted")
except openai.BadRequestError as e:
    assert e.param == "tool_choice" and "nope" in e.message, e.message
try:
    client.chat.completions.create(model="no-such-model", messages=messages)
    raise AssertionError("an unknown model was accepted")
except openai.NotFoundError as e:
    assert e.code == "model_not_found", e.code
try:
    openai.OpenAI(base_url=base_url, api_key="wrong", max_retries=0).models.list()
    raise AssertionError("a wrong key was accepted")
except openai.AuthenticationError as e:
    assert e.status_code == 401, e.status_code
print("errors: BadRequestError (param temperature, tool_choice), NotFoundError, AuthenticationError")
print("the openai client: all checks passed")
