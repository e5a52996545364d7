"""One conversation being built: the Order it is about, the customer's style, and the beats the
intents share (asking for and looking up an order, tool calls, the closing exchange)."""

from __future__ import annotations

import datetime as dt
import random
import re
import sys

from .pools import (CARRIERS, CITIES, COMPANY, CLUB, CURRENCY, CURRENCY_CODE, SUPPORT_EMAIL, Pools,
                    add_business_days, fmt_date, fmt_day, is_plural, phrasing_indices, sub_business_days,
                    variant)
from .tools import NOT_FOUND, compact, order_record

ID_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


class Order:
    """One order: items, money, carrier. Dates are filled in by `Convo.new_order`."""

    def __init__(self, c: "Convo", n_items: int):
        rng = c.rng
        self.number = c.fresh_id("FH-", 7)
        picked = rng.sample(c.pools.products, n_items)
        self.items = [(name, kind, price, variant(rng, kind)) for name, kind, price in picked]
        subtotal = sum(price for _, _, price, _ in self.items)
        self.shipping = 0.0 if subtotal >= 75 else 6.95
        self.total = subtotal + self.shipping
        name, prefix, digits = rng.choice(CARRIERS)
        self.carrier = name
        self.tracking = prefix + "".join(rng.choice("0123456789") for _ in range(digits))
        self.payment = rng.choice(["Visa", "Mastercard", "Amex", "PayPal"])
        self.card_last4 = "".join(rng.choice("0123456789") for _ in range(4))
        self.status = ""
        self.placed = c.today
        self.shipped: dt.date | None = None
        self.eta: dt.date | None = None
        self.delivered: dt.date | None = None
        self.extra: dict = {}  # more lookup_order fields (payments, ...)

    def paid_with(self) -> str:
        if self.payment == "PayPal":
            return "PayPal account"
        return f"{self.payment} ending in {self.card_last4}"

    @property
    def product(self) -> str:
        return self.items[0][0]

    @property
    def kind(self) -> str:
        return self.items[0][1]

    @property
    def price(self) -> float:
        return self.items[0][2]

    @property
    def variant(self) -> str:
        return self.items[0][3]

    @property
    def it(self) -> str:
        """Pronoun for the first product: boots are 'they', a jacket is 'it'."""
        return "they" if is_plural(self.product) else "it"

    def summary(self) -> str:
        names = [name for name, _, _, _ in self.items]
        return names[0] if len(names) == 1 else f"{names[0]} and {names[1]}"



# User-side style: tone and sloppy typing. Only user turns are styled; the assistant always
# writes clean, consistent text.
# ---------------------------------------------------------------------------------------------

CASUAL_SWAPS = [(r"\byou\b", "u"), (r"\bplease\b", "pls"), (r"\bthanks\b", "thx"), (r"\bI'm\b", "im"),
                (r"\bdon't\b", "dont"), (r"\bcan't\b", "cant"), (r"\bit's\b", "its"),
                (r"\bbecause\b", "bc"), (r"\bdidn't\b", "didnt")]


def casualize(text: str, rng: random.Random) -> str:
    for pattern, repl in CASUAL_SWAPS:
        if rng.random() < 0.6:
            text = re.sub(pattern, repl, text, flags=re.IGNORECASE)
    tokens = text.split(" ")
    if rng.random() < 0.6:  # lower-case, but leave order numbers, emails and codes alone
        tokens = [t if re.search(r"[0-9@]", t) or t.isupper() and len(t) > 1 else t.lower()
                  for t in tokens]
    typo_candidates = [i for i, t in enumerate(tokens) if t.isalpha() and t.islower() and len(t) > 5]
    if typo_candidates and rng.random() < 0.7:
        i = rng.choice(typo_candidates)
        w = tokens[i]
        j = rng.randint(1, len(w) - 3)
        tokens[i] = w[:j] + w[j + 1] + w[j] + w[j + 2:]
    text = " ".join(tokens)
    if text.endswith(".") and not text.endswith("..") and rng.random() < 0.7:
        text = text[:-1]
    return text


def angrify(text: str, rng: random.Random, nth_user_turn: int) -> str:
    if nth_user_turn > 2:
        return text
    if text.endswith(".") and rng.random() < 0.6:
        text = text[:-1] + rng.choice(["!", "!!", "!!!"])
    if nth_user_turn == 1 and rng.random() < 0.2:
        text += rng.choice([" 😡", " 😤", " 🙄"])
    return text


# ---------------------------------------------------------------------------------------------
# One conversation being built.
# ---------------------------------------------------------------------------------------------

SYSTEM_PROMPTS = [
    lambda c: (f"You are the customer support assistant for {COMPANY}, an online store for outdoor "
               "clothing and gear. Be polite and concise. Use the tools to look things up, never make "
               "up order details, and confirm the next steps."),
    lambda c: (f"You are a support agent for {COMPANY}. Policies: returns within 30 days of delivery "
               "for unworn, unused items with tags, free prepaid label; refunds go to the original "
               "payment method. Cancel or re-address orders only before they ship. 2-year warranty "
               "against manufacturing defects. Never ask for passwords. Hand over to a human when asked, "
               "on legal threats, or when a problem has failed twice."),
    lambda c: f"{COMPANY} customer service chat. Today is {fmt_day(c.today)}, {c.today.year}.",
    lambda c: (f"You help customers of {COMPANY} with orders, deliveries, returns, billing and account "
               "questions. Keep answers short and friendly. If you don't know something, say so."),
    lambda c: (f"You are the virtual assistant of {COMPANY}. Look up orders with your tools before answering "
               f"about them. Today's date: {c.today.isoformat()}."),
    lambda c: "You are a helpful customer service assistant.",
]

# The helpers of this module whose phrasing lists are keyed by their caller (see `Convo.say`).
_PASS_THROUGH = {"say", "opening", "exchange"}


class Convo:
    def __init__(self, rng: random.Random, pools: Pools, used_ids: set, split: str):
        self.rng = rng
        self.pools = pools
        self.used_ids = used_ids
        self.split = split
        self.today = dt.date(2024, 1, 8) + dt.timedelta(days=rng.randint(0, 540))
        self.first = rng.choice(pools.first)
        self.last = rng.choice(pools.last)
        self.city, self.region = rng.choice(CITIES)
        self.cur = CURRENCY[self.region]
        self.email = self.make_email()
        self.tone = rng.choices(["polite", "neutral", "terse", "angry", "verbose"],
                                weights=[30, 30, 14, 12, 14])[0]
        self.casual = self.tone != "verbose" and rng.random() < 0.22
        self.emoji = rng.random() < 0.07
        self.messages: list[dict] = []
        self.order: Order | None = None
        self.phrasings: list[tuple[str, int, int]] = []  # (site, index, list length) of user turns
        self.protect: list[str] = []  # text that user() must not restyle

    # -- entities -----------------------------------------------------------------------------
    def make_email(self) -> str:
        table = str.maketrans("éëïöüñøäèíóúç", "eeiounoaeiouc")
        first = self.first.lower().translate(table)
        last = self.last.lower().replace("'", "").translate(table)
        local = [f"{first}.{last}", f"{first[0]}{last}", f"{first}{self.rng.randint(7, 99)}",
                 f"{first}_{last[:3]}"][self.rng.randint(0, 3)]
        return f"{local}@{self.rng.choice(['example.com', 'example.org', 'example.net'])}"

    def fresh_id(self, prefix: str, digits: int) -> str:
        while True:
            value = prefix + "".join(self.rng.choice("0123456789") for _ in range(digits))
            if value not in self.used_ids and value[len(prefix)] != "0":
                self.used_ids.add(value)
                return value

    def call_id(self) -> str:
        """9 alphanumeric characters: Mistral's templates refuse any other tool call id."""
        while True:
            value = "".join(self.rng.choice(ID_CHARS) for _ in range(9))
            if value not in self.used_ids:
                self.used_ids.add(value)
                return value

    def new_order(self, status: str, delivered_ago: int = 3, n_items: int | None = None) -> Order:
        """An order whose dates agree with `status` as seen from `self.today`."""
        if n_items is None:
            n_items = 2 if self.rng.random() < 0.2 else 1
        o = Order(self, n_items)
        rng, t = self.rng, self.today
        if status == "processing":
            o.placed = t - dt.timedelta(days=rng.randint(0, 1))
        elif status == "in_transit":
            o.shipped = sub_business_days(t, rng.randint(1, 2))
            o.eta = add_business_days(t, rng.randint(1, 3))
        elif status == "out_for_delivery":
            o.shipped = sub_business_days(t, rng.randint(2, 4))
            o.eta = t
        elif status == "late":
            o.shipped = t - dt.timedelta(days=rng.randint(11, 16))
            o.eta = add_business_days(o.shipped, 4)
        elif status == "delivered":
            o.delivered = t - dt.timedelta(days=delivered_ago)
            o.shipped = sub_business_days(o.delivered, rng.randint(2, 4))
        else:
            raise ValueError(f"unknown order status {status!r}")
        if o.shipped is not None:
            o.placed = sub_business_days(o.shipped, rng.randint(1, 2))
        o.status = "in_transit" if status == "late" else status
        self.order = o
        return o

    def money(self, amount: float) -> str:
        return f"{self.cur}{amount:,.2f}"

    def currency_code(self) -> str:
        return CURRENCY_CODE[self.cur]

    def address(self) -> str:
        street = self.rng.choice(self.pools.streets)
        num = self.rng.randint(2, 980)
        if self.region == "us":
            return f"{num} {street}, {self.city} {self.rng.randint(10000, 99899)}"
        if self.region == "uk":
            code = (f"{self.rng.choice('BDGLMNRS')}{self.rng.choice('ES')}{self.rng.randint(1, 19)} "
                    f"{self.rng.randint(1, 9)}{self.rng.choice('ABDHJLNPQRW')}{self.rng.choice('TUXYZ')}")
            return f"{num} {street}, {self.city} {code}"
        return f"{street} {self.rng.randint(1, 120)}, {self.rng.randint(1000, 99999)} {self.city}"

    def masked_email(self) -> str:
        local, domain = self.email.split("@")
        return f"{local[0]}{'*' * 4}@{domain}"

    # -- turns --------------------------------------------------------------------------------
    def pick(self, options: list):
        return self.rng.choice(options)

    def maybe(self, p: float) -> bool:
        return self.rng.random() < p

    def say(self, options: list[str]) -> str:
        """One of the customer's alternative phrasings, from this split's share of them (see
        `phrasing_indices`); the list is identified by the line of the flow that wrote it."""
        frame = sys._getframe(1)
        while frame.f_code.co_name in _PASS_THROUGH:
            frame = frame.f_back
        site = f"{frame.f_code.co_name}:{frame.f_lineno}"
        i = self.pick(phrasing_indices(len(options), self.split))
        self.phrasings.append((site, i, len(options)))
        return options[i]

    def exchange(self, pairs: list[tuple[list[str], str]]) -> None:
        """One question/answer pair, chosen from (ways to ask, the answer) options."""
        asks, answer = self.pick(pairs)
        self.user(self.say(asks))
        self.bot(answer)

    def user(self, text: str) -> None:
        text = re.sub(r"\s+", " ", text).strip()
        if self.tone == "angry":
            text = angrify(text, self.rng, self.exchanges() + 1)
        if self.casual:  # leave what a tool call will quote (an address) as it is
            kept = [p for p in self.protect if p in text]
            for i, p in enumerate(kept):
                text = text.replace(p, f"\x00{i}\x00")
            text = casualize(text, self.rng)
            for i, p in enumerate(kept):
                text = text.replace(f"\x00{i}\x00", p)
        if self.emoji and self.tone != "angry" and self.maybe(0.5):
            text += self.pick([" 🙂", " 🙏", " 👍", " 😅"])
        self.messages.append({"role": "user", "content": text})

    def bot(self, text: str) -> None:
        text = re.sub(r"[ \t]+", " ", text).strip()
        self.messages.append({"role": "assistant", "content": text})

    def call(self, name: str, arguments: dict, result: dict) -> dict:
        """An assistant turn that calls one tool (no text), and the tool's result."""
        cid = self.call_id()
        self.messages.append({"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "id": cid, "function": {"name": name, "arguments": arguments}}]})
        self.messages.append({"role": "tool", "tool_call_id": cid, "name": name, "content": compact(result)})
        return result

    def exchanges(self) -> int:
        return sum(1 for m in self.messages if m["role"] == "user")

    def sorry(self) -> str:
        """An opening apology sized to the customer's mood."""
        if self.tone == "angry":
            return self.pick([
                "I'm really sorry — I understand how frustrating this is.",
                "I completely understand your frustration, and I'm sorry we've let you down here.",
                "I'm sorry about this. You shouldn't have to chase us, so let's fix it now.",
            ])
        return self.pick(["I'm sorry about that.", "Sorry to hear that!", "I'm sorry for the trouble.",
                          "Oh no, I'm sorry about that.", ""])

    def hello(self) -> str:
        return self.pick(["Hi", "Hello", "Hi there", "Hey", "Good morning", ""])

    def signoff(self) -> str:
        if self.maybe(0.12):
            return self.pick([f" Thanks, {self.first}", f" - {self.first}", f" {self.first} {self.last}"])
        return ""

    def greet_back(self) -> str:
        """Use the customer's name only once they have told us it."""
        given = any(self.first in m["content"] for m in self.messages if m["role"] == "user")
        if given and self.maybe(0.7):
            return self.pick([f"Thanks, {self.first}. ", f"Hello {self.first}! "])
        return ""

    # -- shared beats -------------------------------------------------------------------------
    def ask_for_order(self, purpose: str = "", apologize: bool = True) -> None:
        purpose = purpose or self.pick(["look it up", "check what happened", "take a look"])
        lead = self.sorry() if apologize else self.pick(["Sure!", "Happy to help.", "Of course."])
        self.bot(self.greet_back() + lead + " " + self.pick([
            f"Could you share your order number so I can {purpose}? It starts with FH- and is in your "
            "confirmation email.",
            f"What's the order number (FH- followed by seven digits)? Then I can {purpose}.",
            f"Can you send me the order number? It looks like FH- and seven digits.",
        ]))

    def give_order(self, number: str) -> None:
        self.user(self.say([
            f"It's {number}", f"{number}", f"order number is {number}", f"Sure, {number}.",
            f"Here you go: {number}", f"ok its {number}", f"{number} I think", f"Yes - {number}",
        ]))

    def give_email(self) -> None:
        self.user(self.say([f"{self.email}", f"It's {self.email}", f"the email is {self.email}",
                            f"{self.email} - that's the one I signed up with", f"Should be {self.email}",
                            f"I use {self.email}"]))

    def lookup_order(self) -> dict:
        o = self.order
        return self.call("lookup_order", {"order_id": o.number}, order_record(self, o))

    def close(self) -> None:
        """A thank-you exchange at the end, when there is room for one."""
        if self.exchanges() >= 4:
            return
        if self.tone == "angry":
            self.user(self.say(["Fine.", "ok. I hope this actually gets fixed this time.", "ok thanks.",
                                "Alright, I'll wait for the email.", "Whatever, just make sure it happens."]))
            self.bot(self.pick(["Understood, and I'm sorry again for the hassle.",
                                "Thank you for bearing with us, and sorry again for the trouble."]))
            return
        self.user(self.say(["Thanks!", "ok thank you", "Great, that's all I needed.", "perfect thanks",
                            "Thanks for your help.", "Brilliant, cheers.", "That helps, thank you!",
                            "Awesome, thanks a lot", "ok got it", "Merci, that's great."]))
        self.bot(self.pick([
            "You're welcome! If anything else comes up, just message us here.",
            "Happy to help! Enjoy the rest of your day.",
            f"My pleasure. If you need anything else, we're here — or email {SUPPORT_EMAIL}.",
            "Glad I could help. Take care!",
        ]))

    def to_row(self, with_system: bool) -> list[dict]:
        messages = list(self.messages)
        if with_system:
            messages.insert(0, {"role": "system", "content": self.pick(SYSTEM_PROMPTS)(self)})
        return messages


def lower_first(text: str) -> str:
    if text[:2] in ("I ", "I'") or re.match(r"^[A-Z]{2}", text):
        return text
    return text[0].lower() + text[1:]


def opening(c: Convo, with_number: list[str], without_number: list[str], p_number: float = 0.55) -> bool:
    """The customer's first message; returns whether it already carried the order number."""
    has = c.maybe(p_number) if with_number and without_number else bool(with_number)
    body = c.say(with_number if has else without_number)
    greeting = c.hello()
    if greeting and c.tone not in ("terse", "angry") and not c.messages:
        body = f"{greeting}, {lower_first(body)}"
    signoff = c.signoff()
    if signoff and body[-1] not in ".!?":
        body += "."
    c.user(body + signoff)
    return has


def wrong_number(c: Convo, number: str) -> str:
    """The order number with two neighbouring digits swapped (a number no order has)."""
    digits = list(number[3:])
    for i in c.rng.sample(range(len(digits) - 1), len(digits) - 1):
        if digits[i] != digits[i + 1]:
            digits[i], digits[i + 1] = digits[i + 1], digits[i]
            break
    value = "FH-" + "".join(digits)
    return value if value not in c.used_ids and value != number else number[:-1] + str((int(number[-1]) + 1) % 10)


def found(c: Convo, after_asking: bool) -> str:
    """The assistant's words once lookup_order answered: only what the result says."""
    o = c.order
    lead = "Thanks! " if after_asking and c.maybe(0.5) else ""
    return lead + c.pick([
        f"I've found order {o.number} ({o.summary()}, placed {fmt_date(o.placed)}).",
        f"I have order {o.number} for the {o.summary()} in front of me.",
        "", "", "",
    ])


def lookup(c: Convo, has_number: bool, apologize: bool = True, purpose: str = "",
           reply_sorry: bool = True) -> str:
    """Ask for the order number if the customer has not given it, call lookup_order with what the
    customer gave (a mistyped number first, now and then: the lookup fails and the assistant asks
    again), and return the lead-in of the assistant message that acts on the result."""
    if not has_number:
        c.ask_for_order(purpose, apologize)
        if c.maybe(0.25):
            bad = wrong_number(c, c.order.number)
            c.give_order(bad)
            c.call("lookup_order", {"order_id": bad}, NOT_FOUND)
            c.bot(c.pick([f"I can't find an order with the number {bad}. Could you check it against your "
                          "confirmation email?",
                          f"Hmm, {bad} doesn't match any order. Could you double-check the number?"]))
            c.user(c.say([f"Sorry, typo: {c.order.number}", f"oops, it's {c.order.number}",
                          f"My mistake - {c.order.number}", f"Try {c.order.number}"]))
        else:
            c.give_order(c.order.number)
        c.lookup_order()
        return found(c, after_asking=True).strip()
    c.lookup_order()
    lead = c.greet_back()
    if apologize and reply_sorry:
        lead += c.sorry() + " "
    return (lead + found(c, after_asking=False)).strip()


def pay_back(c: Convo, amount: float, paid_with: str) -> str:
    return c.pick([
        f"The refund of {c.money(amount)} goes back to your {paid_with}; banks take 5-7 business days to "
        "show it.",
        f"{c.money(amount)} will be refunded to your {paid_with}, usually visible within 5-7 business days.",
    ])
