#!/usr/bin/env python3
"""Generate the synthetic customer-service sample dataset in datasets/customer-service/.

Every conversation is built from hand-written templates by a seeded random generator, so
running this script again writes byte-identical files. Nothing here comes from real customers;
the company "Fernhollow Outfitters", its carriers, products, people and addresses are made up.

    python3 scripts/make_customer_service_data.py          # write train.jsonl, eval.jsonl, README stats
    python3 scripts/make_customer_service_data.py --check  # regenerate in memory, exit 1 on any difference

Only the Python standard library is used.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import re
import sys
from pathlib import Path
from typing import NamedTuple

SEED = 20250611
ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "datasets" / "customer-service"
README = OUT_DIR / "README.md"
SPLITS = (("train", 600), ("eval", 80))
# README sections between "<!-- NAME:begin ... -->" and "<!-- NAME:end -->" are rewritten by this script.
GENERATED_SECTIONS = ("example", "stats")

COMPANY = "Fernhollow Outfitters"
SUPPORT_EMAIL = "support@fernhollow.example"
PHONE = "+1 (555) 010-2486"  # 555-01xx numbers are reserved for fiction
CLUB = "Trail Club"

# ---------------------------------------------------------------------------------------------
# Entity pools. They are split into disjoint train / eval parts (see `Pools.split`), so the
# eval conversations mention people, products and codes the training set never saw.
# ---------------------------------------------------------------------------------------------

FIRST_NAMES = [
    "Maya", "Daniel", "Priya", "Tom", "Aisha", "Lucas", "Hannah", "Omar", "Grace", "Mateo",
    "Chloé", "Ben", "Zoë", "Kenji", "Fatima", "Liam", "Sofia", "Noah", "Amara", "Ethan",
    "Renée", "Jack", "Leila", "Oscar", "Nina", "Samuel", "Ines", "Felix", "Yara", "Henry",
    "José", "Ruth", "Arjun", "Clara", "Marcus", "Elena", "Björn", "Tessa", "Kwame", "Lucy",
    "Dmitri", "Ava", "Hugo", "Mei", "Patrick", "Rosa", "Jonas", "Imogen", "Tariq", "Sara",
    "Anaïs", "Victor", "Keira", "Diego", "Freya", "Malik", "Julia", "Rowan", "Aiko", "Simon",
    "Olga", "Caleb", "Nadia", "Finn", "Léa", "Isaac", "Maren", "Rafael", "Holly", "Emeka",
]
LAST_NAMES = [
    "Chen", "Okafor", "Patel", "Müller", "Brooks", "Nakamura", "García", "O'Connor", "Novak",
    "Haddad", "Lindqvist", "Reyes", "Kowalski", "Fischer", "Adeyemi", "Moreau", "Sullivan",
    "Rossi", "Bergström", "Shah", "Kim", "Dubois", "Hughes", "Ivanova", "Nuñez", "Park",
    "Bianchi", "Mensah", "Larsen", "Walsh", "Costa", "Tanaka", "Schneider", "Ali", "Murphy",
    "Jansen", "Petrov", "Silva", "Ortiz", "Kaur", "Andersen", "Morales", "Becker", "Doyle",
]
# (name, kind, price in the store's currency). kind decides which policy wording applies.
PRODUCTS = [
    ("Ridgeline Rain Jacket", "apparel", 129.00), ("Alder Flannel Shirt", "apparel", 59.00),
    ("Drift Down Vest", "apparel", 98.00), ("Trailhead Merino Socks 3-Pack", "apparel", 34.00),
    ("Basin Fleece Pullover", "apparel", 72.00), ("Cirrus Softshell Pants", "apparel", 89.00),
    ("Lowland Cotton Hoodie", "apparel", 64.00), ("Tern Quick-Dry Shorts", "apparel", 42.00),
    ("Harbor Wool Beanie", "apparel", 26.00), ("Solstice Base Layer Top", "apparel", 55.00),
    ("Granite Insulated Parka", "apparel", 219.00), ("Meadow Linen Shirt", "apparel", 68.00),
    ("Cascade Hiking Boots", "footwear", 164.00), ("Pebble Trail Runners", "footwear", 119.00),
    ("Foxglove Camp Slippers", "footwear", 45.00), ("Larch Waterproof Boots", "footwear", 179.00),
    ("Kestrel Approach Shoes", "footwear", 139.00), ("Summit 45L Backpack", "gear", 149.00),
    ("Basin Insulated Bottle 750 ml", "gear", 32.00), ("Tundra 2-Person Tent", "gear", 289.00),
    ("Ember Camp Stove", "gear", 74.00), ("Willow Trekking Poles", "gear", 88.00),
    ("Marten 20L Daypack", "gear", 79.00), ("Sedge Sleeping Pad", "gear", 96.00),
    ("Juniper Down Sleeping Bag", "gear", 249.00), ("Cove Dry Bag 10L", "gear", 29.00),
    ("Aspen Camp Chair", "gear", 65.00), ("Lumen 400 Headlamp", "electronics", 49.00),
    ("Beacon Solar Lantern", "electronics", 58.00), ("Waypoint GPS Watch", "electronics", 239.00),
    ("Spark Power Bank 20000", "electronics", 69.00), ("Halo Heated Gloves", "electronics", 129.00),
]
COLORS = ["Slate Blue", "Moss Green", "Charcoal", "Rust", "Sand", "Black", "Navy", "Heather Grey",
          "Ochre", "Forest"]
SIZES = ["XS", "S", "M", "L", "XL", "XXL"]
SHOE_SIZES = ["US 7", "US 8", "US 8.5", "US 9", "US 10", "US 10.5", "US 11", "EU 39", "EU 42"]
PROMO_CODES = [
    ("TRAIL15", "15% off"), ("WELCOME10", "10% off your first order"), ("SPRING20", "20% off"),
    ("CAMP25", "$25 off"), ("FREESHIP", "free shipping"), ("SUMMIT10", "10% off"),
    ("FALLGEAR", "15% off gear"), ("NEWTRAIL", "10% off"), ("BASECAMP", "20% off"),
    ("FIRELIGHT", "15% off"),
]
STREETS = ["Alder Lane", "Birch Road", "Harbor Street", "Quarry Way", "Mill Court", "Orchard Avenue",
           "Juniper Drive", "Kiln Street", "Heron Close", "Lantern Row", "Copper Street",
           "Fern Terrace", "Granary Lane", "Sorrel Way"]
# (city, region tag). Region decides the currency and the address format.
CITIES = [
    ("Portland, OR", "us"), ("Denver, CO", "us"), ("Austin, TX", "us"), ("Madison, WI", "us"),
    ("Asheville, NC", "us"), ("Boise, ID", "us"), ("Burlington, VT", "us"), ("Tucson, AZ", "us"),
    ("Leeds", "uk"), ("Bristol", "uk"), ("Glasgow", "uk"), ("Norwich", "uk"), ("Cardiff", "uk"),
    ("Berlin", "eu"), ("Lyon", "eu"), ("Utrecht", "eu"), ("Porto", "eu"), ("Graz", "eu"),
    ("Ghent", "eu"), ("Aarhus", "eu"),
]
CARRIERS = [("Swiftline Parcel", "SWL", 12), ("Meridian Post", "MP", 11), ("Cobalt Express", "CBX", 10)]
RELATIONS = ["sister", "dad", "partner", "best friend", "mum", "son", "daughter", "brother"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December"]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
CURRENCY = {"us": "$", "uk": "£", "eu": "€"}


def disjoint_halves(items: list, seed: int, eval_share: float) -> tuple[list, list]:
    """Shuffle a copy with its own seed and cut it: (train part, eval part)."""
    shuffled = list(items)
    random.Random(seed).shuffle(shuffled)
    cut = max(1, round(len(shuffled) * eval_share))
    return shuffled[cut:], shuffled[:cut]


class Pools:
    """The entity pools one split draws from."""

    def __init__(self, split: str):
        part = 0 if split == "train" else 1
        self.first = disjoint_halves(FIRST_NAMES, SEED + 1, 0.2)[part]
        self.last = disjoint_halves(LAST_NAMES, SEED + 2, 0.2)[part]
        self.products = disjoint_halves(PRODUCTS, SEED + 3, 0.2)[part]
        self.promos = disjoint_halves(PROMO_CODES, SEED + 4, 0.2)[part]
        self.streets = disjoint_halves(STREETS, SEED + 5, 0.25)[part]


# ---------------------------------------------------------------------------------------------
# Small formatting helpers.
# ---------------------------------------------------------------------------------------------


def fmt_date(d: dt.date) -> str:
    return f"{MONTHS[d.month - 1]} {d.day}"


def fmt_day(d: dt.date) -> str:
    return f"{WEEKDAYS[d.weekday()]}, {MONTHS[d.month - 1]} {d.day}"


def add_business_days(d: dt.date, n: int) -> dt.date:
    while n > 0:
        d += dt.timedelta(days=1)
        if d.weekday() < 5:
            n -= 1
    return d


def sub_business_days(d: dt.date, n: int) -> dt.date:
    while n > 0:
        d -= dt.timedelta(days=1)
        if d.weekday() < 5:
            n -= 1
    return d


def words(text: str) -> int:
    return len(text.split())


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


def is_plural(product: str) -> bool:
    return product.endswith("s") or product.endswith("Pack")


def article(product: str) -> str:
    if is_plural(product):
        return product
    return f"an {product}" if product[0] in "AEIOU" else f"a {product}"


ZIPPED = {"Ridgeline Rain Jacket", "Drift Down Vest", "Cirrus Softshell Pants", "Granite Insulated Parka",
          "Basin Fleece Pullover"}
WATERPROOF = {"Ridgeline Rain Jacket", "Granite Insulated Parka", "Larch Waterproof Boots",
              "Cascade Hiking Boots"}
LACED = {"Cascade Hiking Boots", "Pebble Trail Runners", "Larch Waterproof Boots", "Kestrel Approach Shoes"}
# (faults that develop with use, damage visible on arrival) for products that need their own words
PRODUCT_ISSUES = {
    "Summit 45L Backpack": (["a shoulder strap seam ripped", "the hip belt buckle snapped"],
                            ["a torn strap", "a ripped side pocket"]),
    "Basin Insulated Bottle 750 ml": (["the lid leaks", "it doesn't keep drinks cold anymore"],
                                      ["a big dent in it", "a cracked lid"]),
    "Tundra 2-Person Tent": (["a pole section cracked", "the floor seam leaks"],
                             ["a snapped pole", "a tear in the rain fly"]),
    "Ember Camp Stove": (["the igniter stopped working", "the gas valve leaks"],
                         ["a bent burner", "a cracked knob"]),
    "Willow Trekking Poles": (["the locking clip broke", "a section won't lock anymore"],
                              ["a bent section", "a missing tip"]),
    "Marten 20L Daypack": (["the main zipper split", "a shoulder strap came loose"],
                           ["a torn strap", "a broken zipper"]),
    "Sedge Sleeping Pad": (["the valve leaks", "it deflates overnight"],
                           ["a puncture in it", "a broken valve"]),
    "Juniper Down Sleeping Bag": (["the zipper broke", "a baffle seam split and down is leaking"],
                                  ["a tear in the shell", "a broken zipper"]),
    "Cove Dry Bag 10L": (["the roll-top seam leaks", "the buckle snapped"],
                         ["a hole in it", "a broken buckle"]),
    "Aspen Camp Chair": (["a leg joint cracked", "the seat fabric tore at the seam"],
                         ["a bent leg", "a cracked joint"]),
    "Lumen 400 Headlamp": (["it won't charge anymore", "the button stopped working"],
                           ["a cracked lens", "a dead battery - it won't turn on"]),
    "Beacon Solar Lantern": (["the solar panel stopped charging", "the light flickers and dies"],
                             ["a cracked solar panel", "a broken handle"]),
    "Waypoint GPS Watch": (["the screen flickers and goes blank", "it won't charge anymore"],
                           ["a scratched screen", "a dead battery - it won't turn on"]),
    "Spark Power Bank 20000": (["it won't hold a charge", "the USB-C port stopped working"],
                               ["a cracked case", "a broken charging port"]),
    "Halo Heated Gloves": (["one glove stopped heating", "the battery won't charge"],
                           ["a torn seam on one glove", "a missing battery pack"]),
}


def product_issues(product: str, kind: str) -> tuple[list[str], list[str]]:
    """Faults and transit damage that make sense for this product."""
    if product in PRODUCT_ISSUES:
        return PRODUCT_ISSUES[product]
    if kind == "apparel":
        faults = ["a seam came apart", "the stitching is unravelling along the hem",
                  "the fabric tore along a seam"]
        damage = ["a tear in the fabric", "a big stain on it", "a hole near the hem"]
    else:
        faults = ["the sole is separating from the upper", "the stitching at the heel came apart",
                  "the lining tore inside"]
        damage = ["a deep scuff and a crushed box", "a tear in the upper", "glue marks all over one shoe"]
    if product in ZIPPED:
        faults = faults + ["the main zipper split", "the zipper pull snapped off"]
        damage = damage + ["a broken zipper"]
    if product in WATERPROOF:
        faults = faults + ["the waterproofing is leaking at the seams"]
    if product in LACED:
        faults = faults + ["an eyelet ripped out"]
    return faults, damage


def variant(rng: random.Random, kind: str) -> str:
    if kind == "apparel":
        return f"size {rng.choice(SIZES)}, {rng.choice(COLORS)}"
    if kind == "footwear":
        return f"{rng.choice(SHOE_SIZES)}, {rng.choice(COLORS)}"
    return rng.choice(COLORS)


# ---------------------------------------------------------------------------------------------
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
               "clothing and gear. Be polite and concise. Ask for the order number when you need it, "
               "never make up order details, and confirm the next steps."),
    lambda c: (f"You are a support agent for {COMPANY}. Policies: returns within 30 days of delivery "
               "for unworn, unused items with tags, using a free prepaid label; refunds go to the "
               "original payment method 5-7 business days after the return arrives. Orders can be "
               "cancelled or re-addressed only before they ship. Gear has a 2-year warranty against "
               "manufacturing defects. Never ask for passwords or full card numbers. Hand the "
               "conversation to a human when the customer asks for one, mentions legal action, or "
               "the same problem has failed twice."),
    lambda c: f"{COMPANY} customer service chat. Today is {fmt_day(c.today)}, {c.today.year}.",
    lambda c: (f"You help customers of {COMPANY} with orders, deliveries, returns, billing and account "
               "questions. Keep answers short and friendly. If you don't know something, say so."),
    lambda c: (f"You are {COMPANY}'s virtual assistant. You can look up orders, returns and payments "
               f"by order number. Today's date: {c.today.isoformat()}."),
    lambda c: "You are a helpful customer service assistant.",
]


class Convo:
    def __init__(self, rng: random.Random, pools: Pools, used_ids: set):
        self.rng = rng
        self.pools = pools
        self.used_ids = used_ids
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

    # -- entities -----------------------------------------------------------------------------
    def make_email(self) -> str:
        first = self.first.lower().translate(str.maketrans("éëïöüñ", "eeioun"))
        last = self.last.lower().replace("'", "").translate(str.maketrans("éëïöüñ", "eeioun"))
        first = first.replace("ø", "o")
        style = self.rng.randint(0, 3)
        local = [f"{first}.{last}", f"{first[0]}{last}", f"{first}{self.rng.randint(7, 99)}",
                 f"{first}_{last[:3]}"][style]
        return f"{local}@{self.rng.choice(['example.com', 'example.org', 'example.net'])}"

    def fresh_id(self, prefix: str, digits: int) -> str:
        while True:
            value = prefix + "".join(self.rng.choice("0123456789") for _ in range(digits))
            if value not in self.used_ids and value[len(prefix)] != "0":
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
        o.status = status
        self.order = o
        return o

    def money(self, amount: float) -> str:
        return f"{self.cur}{amount:,.2f}"

    def case(self) -> str:
        return self.fresh_id("CS-", 6)

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

    # -- turns --------------------------------------------------------------------------------
    def pick(self, options: list):
        return self.rng.choice(options)

    def maybe(self, p: float) -> bool:
        return self.rng.random() < p

    def exchange(self, pairs: list[tuple[list[str], str]]) -> None:
        """One question/answer pair, chosen from (ways to ask, the answer) options."""
        asks, answer = self.pick(pairs)
        self.user(self.pick(asks))
        self.bot(answer)

    def user(self, text: str) -> None:
        text = re.sub(r"\s+", " ", text).strip()
        if self.tone == "angry":
            text = angrify(text, self.rng, self.exchanges() + 1)
        if self.casual:
            text = casualize(text, self.rng)
        if self.emoji and self.tone != "angry" and self.maybe(0.5):
            text += self.pick([" 🙂", " 🙏", " 👍", " 😅"])
        self.messages.append({"role": "user", "content": text})

    def bot(self, text: str) -> None:
        text = re.sub(r"[ \t]+", " ", text).strip()
        self.messages.append({"role": "assistant", "content": text})

    def exchanges(self) -> int:
        return sum(1 for m in self.messages if m["role"] == "user")

    def sorry(self) -> str:
        """An opening apology sized to the customer's mood."""
        if self.tone == "angry":
            return self.pick([
                "I'm really sorry — I understand how frustrating this is, and I want to get it sorted for you.",
                "I completely understand your frustration, and I'm sorry we've let you down here.",
                "I'm sorry about this. You shouldn't have to chase us, so let's fix it now.",
            ])
        return self.pick(["I'm sorry about that.", "Sorry to hear that!", "I'm sorry for the trouble.",
                          "Oh no, I'm sorry about that.", ""])

    def hello(self) -> str:
        return self.pick(["Hi", "Hello", "Hi there", "Hey", "Good morning", ""])

    def signoff(self) -> str:
        if self.maybe(0.15):
            return self.pick([f" Thanks, {self.first}", f" - {self.first}", f" {self.first} {self.last}"])
        return ""

    def name_given(self) -> bool:
        return any(self.first in m["content"] for m in self.messages if m["role"] == "user")

    def greet_back(self) -> str:
        """Use the customer's name only once they have told us it."""
        if self.name_given() and self.maybe(0.7):
            return self.pick([f"Hi {self.first}! ", f"Thanks, {self.first}. ", f"Hello {self.first}! "])
        return ""

    # -- shared beats -------------------------------------------------------------------------
    def ask_for_order(self, purpose: str = "", apologize: bool = True) -> None:
        purpose = purpose or self.pick(["pull up the details", "check what happened", "take a look",
                                        "look into this"])
        lead = self.sorry() if apologize else self.pick(["Sure!", "Happy to help.", "I can check that.",
                                                          "Of course."])
        self.bot(self.greet_back() + lead + " " + self.pick([
            f"Could you share your order number so I can {purpose}? It starts with FH- and is in your "
            "order confirmation email.",
            f"What's the order number? It's in your confirmation email (FH- followed by seven digits), "
            f"and with it I can {purpose}.",
            f"Can you send me the order number (it looks like FH- and seven digits)? Then I'll {purpose}.",
        ]))

    def give_order(self) -> None:
        o = self.order
        self.user(self.pick([
            f"It's {o.number}", f"{o.number}", f"order number is {o.number}", f"Sure, {o.number}.",
            f"Here you go: {o.number}", f"{o.number} - placed on {fmt_date(o.placed)}.",
            f"Yes it's {o.number}, the email on it is {self.email}.",
            f"ok its {o.number}", f"Order {o.number}, ordered {fmt_date(o.placed)}.",
        ]))

    def order_in_opening(self) -> bool:
        return self.maybe(0.45)

    def found(self, after_asking: bool) -> str:
        """The assistant's confirmation that it looked the order up."""
        o = self.order
        if after_asking:
            return self.pick([
                f"Thanks! I've found order {o.number} ({o.summary()}, placed {fmt_date(o.placed)}).",
                f"Thank you. I have order {o.number} for the {o.summary()} in front of me.",
                f"Got it, order {o.number} — {o.summary()}, ordered on {fmt_date(o.placed)}.",
                f"Thanks for that. Order {o.number} ({o.summary()}) is pulled up.",
            ])
        return self.pick([
            f"I've found order {o.number} ({o.summary()}, placed {fmt_date(o.placed)}).",
            f"I have order {o.number} for the {o.summary()} in front of me.",
            f"I've pulled up order {o.number} — {o.summary()}, ordered on {fmt_date(o.placed)}.",
            f"Let me check order {o.number} ({o.summary()}).",
        ])

    def close(self) -> None:
        """A thank-you exchange at the end, when there is room for one."""
        if self.exchanges() >= 4:
            return
        if self.tone == "angry":
            self.user(self.pick(["Fine.", "ok. I hope this actually gets fixed this time.", "ok thanks.",
                                 "Alright, I'll wait for the email.", "Whatever, just make sure it happens.",
                                 "I'll hold you to that."]))
            self.bot(self.pick([
                "Understood, and I'm sorry again for the hassle. Everything above is logged on your "
                "order, so anyone you speak to next will see it.",
                "Thank you for bearing with us. I've noted everything on your account, and you'll get "
                "an email confirmation shortly.",
            ]))
            return
        self.user(self.pick(["Thanks!", "ok thank you", "Great, that's all I needed.", "perfect thanks",
                             "Thanks for your help.", "Brilliant, cheers.", "That helps, thank you!",
                             "Awesome, thanks a lot", "ok got it", "Merci, that's great."]))
        self.bot(self.pick([
            "You're welcome! If anything else comes up, just message us here. Have a great day.",
            "Happy to help! Enjoy the rest of your day.",
            f"My pleasure. If you need anything else, we're here — or email {SUPPORT_EMAIL}.",
            "Glad I could help. Take care!",
            "You're welcome — is there anything else I can help with today?",
        ]))

    def to_row(self, with_system: bool) -> dict:
        messages = list(self.messages)
        if with_system:
            messages.insert(0, {"role": "system", "content": self.pick(SYSTEM_PROMPTS)(self)})
        return {"messages": messages}

    def masked_email(self) -> str:
        local, domain = self.email.split("@")
        return f"{local[0]}{'*' * 4}@{domain}"

    def give_email(self) -> None:
        self.user(self.pick([f"{self.email}", f"It's {self.email}", f"the email is {self.email}",
                             f"{self.email} - that's the one I signed up with.",
                             f"Should be {self.email}"]))


# ---------------------------------------------------------------------------------------------
# Flow helpers shared by the intents.
# ---------------------------------------------------------------------------------------------


def lower_first(text: str) -> str:
    if text[:2] in ("I ", "I'") or re.match(r"^[A-Z]{2}", text):
        return text
    return text[0].lower() + text[1:]


def opening(c: Convo, with_number: list[str], without_number: list[str]) -> bool:
    """The customer's first message; returns whether it already carried the order number."""
    has = c.order_in_opening() if with_number and without_number else bool(with_number)
    body = c.pick(with_number if has else without_number)
    greeting = c.hello()
    if greeting and c.tone not in ("terse", "angry") and not c.messages:
        body = f"{greeting}, {lower_first(body)}"
    signoff = c.signoff()
    if signoff and body[-1] not in ".!?":
        body += "."
    c.user(body + signoff)
    return has


def lookup(c: Convo, has_number: bool, apologize: bool = True, purpose: str = "",
           reply_sorry: bool = True) -> str:
    """Ask for the order number if the customer has not given it; return the lead-in for the
    assistant message that acts on the order. `reply_sorry=False` when that message carries its
    own, more specific apology."""
    if not has_number:
        c.ask_for_order(purpose, apologize)
        c.give_order()
        return c.found(after_asking=True)
    lead = c.greet_back()
    if apologize and reply_sorry:
        lead += c.sorry() + " "
    return (lead + c.found(after_asking=False)).strip()


def pay_back(c: Convo, amount: float) -> str:
    o = c.order
    return c.pick([
        f"The refund of {c.money(amount)} goes back to your {o.paid_with()}; depending on your bank "
        "it can take 5-7 business days to show up.",
        f"{c.money(amount)} will be refunded to your {o.paid_with()}. Banks usually take 5-7 business "
        "days to show it on your statement.",
    ])


def condition_rule(kind: str, plural: bool) -> str:
    its = "their" if plural else "its"
    return {
        "apparel": "unworn and unwashed with the tags still attached",
        "footwear": "unworn outdoors (trying them on indoors is fine) and in the original box",
        "gear": f"unused and in {its} original packaging",
        "electronics": f"unused and in {its} original packaging with all accessories",
    }[kind]


# ---------------------------------------------------------------------------------------------
# Intents: each function writes one conversation into `c`.
# ---------------------------------------------------------------------------------------------


def flow_order_status(c: Convo) -> None:
    status = c.pick(["processing", "in_transit", "in_transit", "out_for_delivery", "delivered"])
    o = c.new_order(status, delivered_ago=c.rng.randint(0, 2))
    p, rel = o.product, c.pick(RELATIONS)
    has = opening(c, [
        f"Where is my order {o.number}?",
        f"Can you check the status of order {o.number} please?",
        f"I ordered the {p} on {fmt_date(o.placed)}. Order number {o.number}. When will it arrive?",
        f"any update on {o.number}",
        f"I placed an order a few days ago for {article(p)} as a present for my {rel}, and I'd love to know "
        f"when it's going to arrive. The order number is {o.number}. Thank you so much!",
        f"Status of {o.number}?",
        f"Could you tell me when {o.number} will be delivered? I'm away from {fmt_date(c.today + dt.timedelta(days=6))}.",
    ], [
        "Can you tell me where my order is?",
        f"I ordered {article(p)} recently. Any idea when it will arrive?",
        "I'd like to check on my order please.",
        "where's my stuff",
        f"I bought the {p} as a gift for my {rel} - can you check when it will get here?",
        "When will my order arrive?",
        "Has my order shipped yet?",
    ])
    lead = lookup(c, has, apologize=False, purpose="check on it")
    if status == "processing":
        ship_by = add_business_days(o.placed, 2)
        text = (f"It's still being packed at our warehouse. Orders usually ship within 1-2 business days, "
                f"so it should leave us by {fmt_day(ship_by)}. You'll get an email with the tracking "
                "number as soon as it ships.")
    elif status == "in_transit":
        text = (f"It shipped on {fmt_date(o.shipped)} with {o.carrier}, tracking number {o.tracking}. "
                f"The carrier currently expects to deliver it by {fmt_day(o.eta)}.")
    elif status == "out_for_delivery":
        text = (f"Good news: it's out for delivery today with {o.carrier} (tracking {o.tracking}), so it "
                "should reach you by the end of the day.")
    else:
        text = (f"Tracking shows {o.carrier} delivered it on {fmt_day(o.delivered)}. If you can't find it, "
                "it's worth checking with neighbours or a parcel room first - and if it's not there, "
                "tell me and I'll open a claim.")
    c.bot(f"{lead} {text}")
    if c.maybe(0.55):
        follow_up_order_status(c, status)
    if c.maybe(0.7):
        c.close()


def follow_up_order_status(c: Convo, status: str) -> None:
    o = c.order
    if status == "in_transit" and c.maybe(0.5):
        c.user(c.pick(["Can you send it to my work address instead?",
                       "Is it possible to change the delivery address? I won't be home.",
                       "can it go to my office"]))
        c.bot(f"Once a parcel is with the carrier we can't change the address from our side. You may be "
              f"able to request a redirect on {o.carrier}'s tracking page with {o.tracking}. If the parcel "
              "ends up coming back to us, I'll reship it or refund you, whichever you prefer.")
    elif status in ("in_transit", "out_for_delivery"):
        c.exchange([
            (["What time will it come?", "Do you know roughly what time they'll deliver?", "what time window"],
             f"I don't have a delivery time window, I'm afraid. {o.carrier} usually shows one on the "
             f"tracking page on the day of delivery, so checking {o.tracking} that morning is the best bet."),
            (["Will I need to be home to sign for it?", "Do I have to be in?"],
             "I can't see whether this parcel needs a signature, so I don't want to guess. "
             f"{o.carrier}'s tracking page for {o.tracking} shows the delivery options, including leaving "
             "it with a neighbour or at a pickup point."),
        ])
    elif status == "processing":
        if c.maybe(0.5):
            c.user(c.pick(["Can I still add something to it?", "Could I add another item to that order?"]))
            c.bot("I'm not able to add items to an existing order. You could place a separate order for "
                  "the extra item, or, since this one hasn't shipped yet, I can cancel it so you can "
                  "reorder everything together. Just let me know.")
        else:
            c.user(c.pick(["Can you upgrade it to express shipping?", "can it be sent express instead"]))
            c.bot("I can't change the shipping method on an order that's already placed, sorry. It will "
                  "go out with the method you chose at checkout, and the tracking email will show the "
                  "carrier's delivery estimate.")
    else:
        c.user(c.pick(["Oh found it, it was with my neighbour.", "Ah it was in the parcel room, sorry!",
                       "Found it behind the plant pot 🙈 thanks"]))
        c.bot("Great, glad it turned up! Enjoy your order, and let us know if you need anything else.")


SCANS = ["In transit", "Arrived at sort facility", "Departed distribution center",
         "Processed at regional hub", "Held at depot"]


def flow_late_delivery(c: Convo) -> None:
    o = c.new_order("late")
    stuck = c.maybe(0.5)
    last_scan = c.today - dt.timedelta(days=c.rng.randint(7, 10) if stuck else c.rng.randint(2, 4))
    scan = c.pick(SCANS)
    p = o.product
    has = opening(c, [
        f"My order {o.number} was supposed to arrive on {fmt_date(o.eta)} and it still isn't here.",
        f"{o.number} is late. Tracking hasn't moved in days.",
        f"It's been two weeks since I ordered ({o.number}) and nothing has arrived.",
        f"I'm writing about order {o.number}. The estimated delivery date was {fmt_date(o.eta)}, but I "
        f"still haven't received anything, and I need the {p} for a trip soon. Could you please find out "
        "what's going on?",
    ], [
        "My package is late.",
        "my order still hasn't arrived and it's past the delivery date",
        f"The {p} I ordered should have been here by {fmt_date(o.eta)}. Still nothing.",
        "I've been waiting forever for my delivery, what is going on?",
        "Where is my parcel? The estimated date was days ago.",
    ])
    lead = lookup(c, has)
    scanned = f"{o.carrier} last scanned it on {fmt_date(last_scan)} (\"{scan}\")"
    if stuck:
        n = (c.today - last_scan).days
        case = c.case()
        c.bot(f"{lead} {scanned}, and there has been no movement for {n} days. A parcel with no update "
              f"for 7 days counts as lost, so I've opened an investigation with {o.carrier} (case {case}). "
              f"You don't have to wait for it: I can send a replacement right away at no cost, or refund "
              f"{c.money(o.total)}. Which would you prefer?")
        lost_parcel_choice(c)
    else:
        wait_until = last_scan + dt.timedelta(days=7)
        c.bot(f"{lead} It's running late: the original estimate was {fmt_date(o.eta)}, and {scanned}. "
              "It's still moving, so the best thing is to give it a few more days. If there's no new "
              f"update by {fmt_day(wait_until)}, message us and we'll treat it as lost and send a "
              "replacement or a refund, whichever you prefer.")
        if c.maybe(0.6):
            c.exchange([
                (["I need it by Saturday, can you guarantee that?", "Will it definitely come this week?"],
                 f"I'm sorry, I can't promise a delivery date that {o.carrier} hasn't given us, and I'd "
                 f"rather not guess. If there's no update by {fmt_date(wait_until)}, a replacement or refund "
                 "is guaranteed - I've noted that on your order so anyone you talk to can act straight away."),
                (["Can't you just send another one now?", "Why not send a replacement today?"],
                 "I understand the wait is annoying. While the parcel is still moving, we wait before "
                 f"sending a second one, because the first usually turns up. If it hasn't moved by "
                 f"{fmt_date(wait_until)}, we'll replace or refund it, your choice."),
                (["So I just have to wait? That's not great.", "Can you contact the carrier and ask them?"],
                 f"I'm sorry, I know that's not ideal. I've added a note to order {o.number} and asked "
                 f"{o.carrier} for an update; if they reply, we'll email you. And if it hasn't moved by "
                 f"{fmt_date(wait_until)}, we'll replace or refund it, your choice."),
            ])
    if c.maybe(0.5):
        c.close()


def lost_parcel_choice(c: Convo) -> None:
    o = c.order
    if c.maybe(0.5):
        c.user(c.pick(["Replacement please.", "A replacement, I still need it.", "Can you reship it?",
                       "send a new one pls", "Replace it please - same size and colour."]))
        c.bot(f"Done - we'll ship a replacement for the {o.summary()} within 1-2 business days, and you'll "
              "get a new tracking number by email. If the original parcel turns up after all, just let us know "
              "and we'll send a free return label for it.")
    else:
        c.user(c.pick(["Just refund me.", "Refund please.", "I'd rather have my money back.",
                       "refund. I'm done waiting."]))
        c.bot(f"Done - I've issued the refund. {pay_back(c, o.total)} If the original "
              "parcel does arrive later, you can refuse it or send it back with a free return label.")


def flow_lost_package(c: Convo) -> None:
    ago = c.rng.randint(0, 4)
    o = c.new_order("delivered", delivered_ago=ago)
    when = {0: "today", 1: "yesterday"}.get(ago, f"on {fmt_date(o.delivered)}")
    has = opening(c, [
        f"Tracking for {o.number} says delivered but there's nothing here.",
        f"It says my parcel was delivered {when} but I never got it. Order {o.number}.",
        f"Order {o.number} shows as delivered. It wasn't. Where is it?",
        f"I hope you can help. The tracking for my order {o.number} says it was delivered {when}, "
        "but I've looked everywhere - porch, mailbox, even asked the neighbours - and there's no sign of it.",
    ], [
        "My order says delivered but I didn't receive it.",
        f"the tracking says delivered {when}?? nothing at my door",
        "Parcel marked as delivered, not received. What now?",
        "I think my package was stolen, it says delivered but it's not here.",
    ])
    lead = lookup(c, has)
    if ago <= 1:
        c.bot(f"{lead} {o.carrier} marked it as delivered {when}. Sometimes a parcel is scanned as "
              "delivered a little early and arrives within 24 hours. Could you check around your "
              "entrance, with neighbours, or in a building mailroom? If it still hasn't turned up by "
              "tomorrow evening, message us and I'll open a claim straight away.")
        if c.maybe(0.6):
            c.user(c.pick(["ok, I'll check and come back.", "Fine, I'll wait until tomorrow.",
                           "alright thanks, will look"]))
            c.bot("Sounds good. Your order is noted, so whoever you talk to tomorrow can pick it up "
                  "right away.")
        return
    address = c.address()
    c.bot(f"{lead} {o.carrier} marked it as delivered {when}. Before I open a claim, could you confirm "
          f"the delivery address is {address}?")
    c.user(c.pick(["Yes that's right.", "yes correct", "Yes, and I already checked with the neighbours.",
                   "That's the right address, yes."]))
    case = c.case()
    c.bot(f"Thank you. I've opened a missing-parcel claim with {o.carrier} (case {case}). You don't need to "
          f"wait for it to finish: I can ship a replacement now or refund {c.money(o.total)}. Which would "
          "you like?")
    lost_parcel_choice(c)


WRONG = {
    "apparel": ["the wrong size", "a completely different colour"],
    "footwear": ["the wrong size", "two left shoes"],
    "gear": ["a different colour", "the wrong model"],
    "electronics": ["a different model", "the wrong colour"],
}


def flow_wrong_item(c: Convo) -> None:
    o = c.new_order("delivered", delivered_ago=c.rng.randint(0, 5), n_items=1)
    wrong = c.pick(WRONG[o.kind])
    if c.maybe(0.3):
        other = c.pick([name for name, _, _ in c.pools.products if name != o.product])
        wrong = article(other)
    has = opening(c, [
        f"I ordered the {o.product} ({o.variant}) but received {wrong}. Order {o.number}.",
        f"Wrong item in my parcel for {o.number} - I got {wrong}.",
        f"You sent me {wrong}!! Order {o.number}. I ordered {o.variant}.",
        f"My order {o.number} arrived today, but inside was {wrong} instead of the {o.product} I ordered.",
    ], [
        f"I received {wrong} instead of what I ordered.",
        "You sent me the wrong item.",
        f"The box came but it's {wrong}, not what I paid for.",
        "wrong item delivered, what do I do?",
    ])
    lead = lookup(c, has, reply_sorry=False)
    if c.maybe(0.75):
        c.bot(f"{lead} I'm sorry we sent the wrong item. I'll ship the correct {o.product} ({o.variant}) at "
              "no cost within 1-2 business days, and you'll get tracking by email. For the item you "
              f"received, I've emailed a prepaid return label to {c.masked_email()} - please send it back "
              "within 14 days. You don't need to wait for the return before the replacement ships.")
        if c.maybe(0.5):
            c.exchange([
                (["Do I need the original packaging?", "what box do I use"],
                 "Any sturdy box or bag is fine - the original packaging isn't required. Just stick the "
                 "label on the outside and cover any old barcodes."),
                (["Can I just keep the wrong one?", "Do I really have to send it back?"],
                 "Please do send it back with the label - it's free, and it helps our warehouse fix the "
                 "stock mix-up that caused this."),
                (["Where do I drop off the return?", "I don't have a printer for the label."],
                 f"You can drop it at any {o.carrier} location or parcel point; the label email has a QR "
                 "code they can scan, so you don't need to print anything."),
            ])
    else:
        c.bot(f"{lead} I'm sorry we sent the wrong item. Unfortunately the {o.product} in {o.variant} is out "
              "of stock right now, so I can't send a replacement. I can refund "
              f"{c.money(o.price)} in full today, and I've emailed a prepaid return label for the item you "
              "received. Would you like the refund?")
        if c.maybe(0.4):
            c.user(c.pick(["When will it be back in stock?", "Do you know when you'll have it again?"]))
            c.bot("I don't have a restock date, and I'd rather not guess. If you'd like, use 'Notify me' on "
                  "the product page and you'll get an email when it's back. Shall I go ahead with the refund "
                  "in the meantime?")
        c.user(c.pick(["Yes, refund please.", "ok go ahead", "Yes please."]))
        c.bot(f"Done. {pay_back(c, o.price)} Please send the other item back with the label within 14 days.")
    if c.maybe(0.5):
        c.close()


def flow_damaged_item(c: Convo) -> None:
    o = c.new_order("delivered", delivered_ago=c.rng.randint(0, 6), n_items=1)
    damage = c.pick(product_issues(o.product, o.kind)[1])
    has = opening(c, [
        f"The {o.product} from order {o.number} arrived with {damage}.",
        f"Order {o.number} came damaged - {damage}.",
        f"Really disappointed. My {o.product} ({o.number}) arrived with {damage}. Not what I expect "
        "for the price.",
        f"I just unpacked my order {o.number} and the {o.product} has {damage}. What are my options?",
    ], [
        f"My {o.product} arrived damaged.",
        f"I got my order today and it has {damage}.",
        "item arrived broken",
        f"Hi, the {o.product} I received has {damage}. Can I get a new one?",
    ])
    lead = lookup(c, has, reply_sorry=False)
    c.bot(f"{lead} I'm sorry {o.it} arrived like that. I've emailed a link to {c.masked_email()} where you can "
          "upload a photo or two of the damage (and the box, if you still have it). In the meantime: "
          f"would you like a replacement or a full refund of {c.money(o.price)}? Either way you won't need "
          "to send the damaged item back.")
    if c.maybe(0.55):
        c.user(c.pick(["Replacement please, photos uploaded.", "A replacement. I've sent the photos.",
                       "new one pls, uploaded pics", "Replacement, same size. Photos are up."]))
        c.bot(f"Thank you, the photos came through. A replacement for the {o.product} ({o.variant}) will "
              "ship within 1-2 business days, and the tracking number will be emailed to you. Please recycle "
              "or dispose of the damaged item.")
    else:
        c.user(c.pick(["Refund please. Photos uploaded.", "I'd prefer a refund, I've uploaded the pics.",
                       "just refund it, pics are uploaded"]))
        c.bot(f"Thanks, the photos are on your order now. I've issued the refund. {pay_back(c, o.price)}")
    if c.maybe(0.5):
        c.close()


REASONS = ["it doesn't fit", "the colour looks different in person", "I changed my mind",
           "it's smaller than I expected", "it's heavier than I need", "I got the same thing as a gift"]


def flow_return_request(c: Convo) -> None:
    case = c.pick(["eligible", "eligible", "eligible", "late", "used"])
    ago = {"eligible": c.rng.randint(2, 26), "late": c.rng.randint(34, 75),
           "used": c.rng.randint(5, 20)}[case]
    o = c.new_order("delivered", delivered_ago=ago, n_items=1)
    reason = c.pick(REASONS)
    if case == "used":
        them = "it" if o.it == "it" else "them"
        reason = c.pick([f"I wore {them} once and {o.it}'re not comfortable".replace("it're", "it's"),
                         f"I've worn {them} a couple of times but {o.it}'re not for me".replace("it're", "it's")]
                        if o.kind in ("apparel", "footwear") else
                        [f"I used {them} on one trip and didn't like {them}",
                         f"I tried {them} out at the weekend and {o.it}'re not what I need".replace("it're", "it's")])
    example = product_issues(o.product, o.kind)[0][0]
    has = opening(c, [
        f"I'd like to return the {o.product} from order {o.number} - {reason}.",
        f"How do I return {o.number}? {reason[0].upper() + reason[1:]}.",
        f"I want a refund for order {o.number}, {reason}.",
        f"Could I send back the {o.product} please? Order {o.number}. The reason is {reason}.",
    ], [
        f"I want to return something, {reason}.",
        "How do returns work?",
        f"Can I return the {o.product}? {reason[0].upper() + reason[1:]}.",
        f"I need to send back an item - {reason}. How do I get a refund?",
    ])
    lead = lookup(c, has, apologize=False, purpose="check the return window")
    until = o.delivered + dt.timedelta(days=30)
    if case == "eligible":
        c.bot(f"{lead} It was delivered on {fmt_date(o.delivered)}, so you're within the 30-day return "
              f"window (until {fmt_date(until)}). As long as {o.it} {'is' if o.it == 'it' else 'are'} "
              f"{condition_rule(o.kind, is_plural(o.product))}, you're all set: "
              f"I've emailed a prepaid return label to {c.masked_email()}. Pack the item, attach the label "
              f"and drop it at any {o.carrier} location. Once it reaches our warehouse we refund "
              f"{c.money(o.price)} to your original payment method, usually within 5-7 business days.")
        if c.maybe(0.6):
            follow_up_return(c)
    elif case == "late":
        c.bot(f"{lead} It was delivered on {fmt_date(o.delivered)}, {ago} days ago, so it's outside our "
              "30-day return window and I'm not able to accept a return for it, I'm sorry. If something is "
              f"actually wrong with it (for example, {example}), that's covered by our 2-year warranty "
              "against manufacturing defects, and I can start a warranty claim for you.")
        if c.maybe(0.6):
            c.user(c.pick(["Seriously? It's only a few days over. Can't you make an exception?",
                           "Can you make an exception just this once?",
                           "That's really unhelpful. I've been a customer for years."]))
            c.bot("I understand, and I'm sorry it's not the answer you hoped for. The 30-day window applies "
                  "to every order and I can't override it from here. If you'd like a person to review it, "
                  "I can pass your request to our Customer Care team - I can't promise a different outcome, "
                  "but they will reply by email within 1 business day.")
    else:
        c.bot(f"{lead} It's within the 30-day window, but returns are only accepted when the item is "
              f"{condition_rule(o.kind, is_plural(o.product))}, so I can't take {'it' if o.it == 'it' else 'them'} back after "
              f"use - I'm sorry. If there's a defect (for example, {example}), our 2-year warranty covers "
              "that and I'd be happy to start a claim.")
        if c.maybe(0.5):
            c.user(c.pick(["No defect, it just doesn't suit me. Ok.", "Fair enough, thanks for explaining.",
                           "ok, I'll sell it on then"]))
            c.bot("Thanks for understanding. If anything does go wrong with it later, just message us with "
                  f"order {o.number} and we'll look at it under the warranty.")
    if c.maybe(0.5):
        c.close()


def follow_up_return(c: Convo) -> None:
    o = c.order
    q = c.pick(["free", "exchange", "time", "label"])
    if q == "free":
        c.user(c.pick(["Is the return shipping free?", "do I have to pay for postage?"]))
        extra = ("your order shipped free, so nothing is deducted." if o.shipping == 0 else
                 f"the original {c.money(o.shipping)} delivery fee isn't refunded unless the item was "
                 "faulty or wrong.")
        c.bot(f"Yes, the prepaid label is free for returns within the window. The refund covers the item "
              f"price; {extra}")
    elif q == "exchange" and o.kind in ("apparel", "footwear"):
        sizes = SIZES if o.kind == "apparel" else SHOE_SIZES
        new = c.pick([s for s in sizes if s not in o.variant])
        c.user(c.pick([f"Actually could I exchange it for {new} instead?", f"Can I swap it for a {new}?"]))
        c.bot(f"Yes, exchanges are free. I've set up an exchange for the {o.product} in {new} on order "
              f"{o.number}, using the same return label. We'll ship the {new} as soon as the carrier scans "
              "your return, so you won't have to wait for it to reach the warehouse.")
    elif q == "time":
        c.user(c.pick(["How long until I get my money back?", "when will I see the refund?"]))
        c.bot(f"Returns usually take 3-5 business days to reach our warehouse after drop-off. We refund the "
              "same day they're checked in, and then your bank typically needs 5-7 business days. You'll get "
              "an email at each step.")
    else:
        c.user(c.pick(["I don't have a printer.", "I didn't get the label email", "no printer at home"]))
        c.bot(f"No problem: the email also has a QR code, and {o.carrier} can print the label for you at the "
              f"drop-off point. If the email isn't in your inbox within 10 minutes, check the spam folder, "
              f"or tell me and I'll resend it to {c.masked_email()}.")


def flow_refund_status(c: Convo) -> None:
    o = c.new_order("delivered", delivered_ago=c.rng.randint(12, 30), n_items=1)
    state = c.pick(["issued_recent", "issued_old", "in_transit"])
    has = opening(c, [
        f"I returned the {o.product} from {o.number} and haven't had my refund yet.",
        f"Where is my refund for order {o.number}?",
        f"Sent back my return for {o.number} ages ago. Still no money.",
    ], [
        "I sent a return back but haven't received my refund.",
        "where is my refund??",
        f"When will I get the money back for the {o.product} I returned?",
        "Can you check on a refund for me please?",
    ])
    lead = lookup(c, has, apologize=False)
    if state == "issued_recent":
        issued = sub_business_days(c.today, c.rng.randint(1, 3))
        by = add_business_days(issued, 7)
        c.bot(f"{lead} Your return arrived at our warehouse and we issued the refund of {c.money(o.price)} "
              f"to your {o.paid_with()} on {fmt_date(issued)}. Banks usually take 5-7 business days to "
              f"show it, so it should appear by {fmt_day(by)}.")
    elif state == "issued_old":
        issued = sub_business_days(c.today, c.rng.randint(9, 14))
        ref = c.fresh_id("RF-", 8)
        c.bot(f"{lead} We issued the refund of {c.money(o.price)} to your {o.paid_with()} on "
              f"{fmt_date(issued)}, reference {ref}. That's longer ago than the usual 5-7 business days, so "
              "the money has left us - your bank or card provider can trace it with that reference. If "
              "they can't find it, come back to us and we'll investigate on our side.")
    else:
        scanned = sub_business_days(c.today, c.rng.randint(1, 3))
        c.bot(f"{lead} Your return was dropped off with {o.carrier} on {fmt_date(scanned)} and is on its way "
              "to our warehouse - it hasn't arrived yet. Returns usually take 3-5 business days in transit. "
              f"We refund {c.money(o.price)} the day it's checked in, and you'll get an email when that "
              "happens.")
    if state != "issued_old" and c.maybe(0.4):
        c.user(c.pick(["Can you speed it up?", "Can't you just refund it now?", "Is there anything faster?"]))
        step = ("speed up the bank's processing once a refund has left us" if state == "issued_recent" else
                "issue the refund before the return is checked in")
        c.bot(f"I'm afraid I can't {step} - that step is the same for every order. I've added a note to "
              "your order so anyone you speak to next can see where it stands.")
    if c.maybe(0.5):
        c.close()


def flow_cancel_order(c: Convo) -> None:
    shipped = c.maybe(0.35)
    o = c.new_order("in_transit" if shipped else "processing")
    has = opening(c, [
        f"I need to cancel order {o.number}.",
        f"Please cancel {o.number}, I ordered the wrong size.",
        f"Can I cancel my order? {o.number}",
        f"I placed order {o.number} by mistake - could you cancel it please?",
        f"cancel {o.number} pls, found it cheaper elsewhere",
    ], [
        "I want to cancel my order.",
        "How do I cancel an order I just placed?",
        "Is it too late to cancel my order?",
        "I ordered the wrong thing, can you cancel it?",
    ])
    lead = lookup(c, has, apologize=False)
    if shipped:
        c.bot(f"{lead} It already shipped on {fmt_date(o.shipped)} with {o.carrier}, so I can't cancel it "
              "anymore. Once it arrives, you can return it within 30 days with a free prepaid label, and "
              "we'll refund you when it's back at our warehouse. Would you like me to email the return "
              "label now so it's ready?")
        c.user(c.pick(["Yes please.", "ok send it", "Fine, yes.", "sure"]))
        c.bot(f"Sent to {c.masked_email()}. When the parcel arrives, leave the item unused in its packaging, "
              f"attach the label and drop it at any {o.carrier} location. The refund goes to your "
              f"{o.paid_with()} once it's checked in.")
    elif len(o.items) == 2 and c.maybe(0.6):
        keep, drop = o.items[0], o.items[1]
        c.bot(f"{lead} It hasn't shipped yet, so I can cancel it. Just to confirm: cancel the whole order "
              f"({o.summary()}, {c.money(o.total)})?")
        c.user(f"Actually can I just cancel the {drop[0]} and keep the {keep[0]}?")
        c.bot(f"Yes - I've removed the {drop[0]} from order {o.number}; the {keep[0]} will ship as normal. "
              f"{pay_back(c, drop[2])}")
    else:
        c.bot(f"{lead} It hasn't shipped yet, so I can cancel it. Just to confirm: cancel the whole order "
              f"({o.summary()}, {c.money(o.total)})?")
        c.user(c.pick(["Yes please.", "yes", "Yes, cancel it.", "Correct, thank you."]))
        c.bot(f"Done - order {o.number} is cancelled and you'll get a confirmation email shortly. "
              f"{pay_back(c, o.total)}")
    if c.maybe(0.45):
        c.close()


def flow_address_change(c: Convo) -> None:
    mode = c.pick(["processing", "processing", "shipped", "account"])
    if mode == "account":
        c.user(c.pick(["How do I change the address saved on my account? I moved.",
                       "I've moved house - where do I update my address?",
                       "need to update my default shipping address"]))
        c.bot("You can update it under Account > Addresses: add the new address and set it as default. "
              "That applies to future orders only, so if you have an order that hasn't shipped yet, tell "
              "me the order number and I'll check whether I can change it too.")
        if c.maybe(0.4):
            c.user(c.pick(["No open orders, thanks.", "That's all, thanks!", "ok done, thanks"]))
            c.bot("Great - you're all set. Happy to help!")
        return
    o = c.new_order("processing" if mode == "processing" else "in_transit")
    has = opening(c, [
        f"Can I change the delivery address on {o.number}?",
        f"I put the wrong address on order {o.number}!",
        f"Need to update shipping address for {o.number}, I've moved.",
    ], [
        "I entered the wrong delivery address, can you fix it?",
        "Can I change where my order is being delivered?",
        "wrong address on my order, help",
    ])
    lead = lookup(c, has, apologize=False)
    if mode == "processing":
        c.bot(f"{lead} It hasn't shipped yet, so I can still update the address. What's the new address, "
              "including the postcode?")
        new = c.address()
        c.user(c.pick([f"{new}", f"It should be {new}", f"New address: {new}. Thanks!"]))
        c.bot(f"Updated. Order {o.number} will now ship to: {new}. You'll get a confirmation email with the "
              "new address - please check it, since I can only change it until the order ships.")
    else:
        c.bot(f"{lead} It's already on its way with {o.carrier} (tracking {o.tracking}), so I can't change "
              "the address from our side anymore. You can try requesting a redirect on the carrier's "
              "tracking page. If the parcel can't be delivered, it comes back to us, and then I'll reship "
              "it to the right address or refund you.")
    if c.maybe(0.5):
        c.close()


def flow_password_reset(c: Convo) -> None:
    mode = c.pick(["forgot", "forgot", "no_email", "expired", "shared"])
    if mode == "shared":
        pw = c.pick(["Trailhead2023", "hunter22!", "maple*leaf9", "Summer2024"])
        c.user(c.pick([f"I can't log in. My email is {c.email} and my password is {pw}, can you check what's wrong?",
                       f"Login not working. {c.email} / {pw}"]))
        c.bot("Please don't share your password with anyone, including us - I'll never need it. Since it "
              "has now been written in this chat, I'd recommend changing it. I've sent a password reset "
              f"link to {c.masked_email()}; it's valid for 60 minutes. Choose a new password you haven't "
              "used before, and you should be able to log in straight away.")
        if c.maybe(0.5):
            c.close()
        return
    opening_text = {
        "forgot": ["I forgot my password.", "Can't log in, forgot my password", "How do I reset my password?",
                   "I'm on my phone in a café and can't remember my password - how do I get back in?",
                   "I can't remember my password and the site keeps saying it's wrong."],
        "no_email": ["I requested a password reset but never got the email.",
                     "reset password email not arriving", "The reset link email isn't coming through."],
        "expired": ["The password reset link says it has expired.",
                    "I clicked the reset link and it says invalid or expired??"],
    }[mode]
    opening(c, [], opening_text)
    c.bot(c.pick(["I can help with that.", "No problem.", "Sure, let's sort that out."]) + " " + c.pick([
        "What email address is your account registered with?",
        "Which email address do you use to log in?",
    ]))
    c.give_email()
    if mode == "forgot":
        c.bot("Thanks. If that address matches an account, a password reset link is on its way. The link is "
              "valid for 60 minutes. If it doesn't arrive within a few minutes, please check your spam or "
              "promotions folder.")
    elif mode == "no_email":
        c.bot(f"Thanks. I've sent a new reset link to {c.masked_email()}. It comes from {SUPPORT_EMAIL}, and it "
              "sometimes lands in spam or promotions, so please check there. If it's still not there in 10 "
              "minutes, the account may be under a different email address - do you have another one you "
              "might have used?")
        if c.maybe(0.5):
            c.user(c.pick(["Found it in spam, thanks!", "got it now", "It was in promotions, thank you."]))
            c.bot("Great! The link is valid for 60 minutes. Adding our address to your contacts should keep "
                  "future emails out of spam.")
    else:
        c.bot(f"Thanks. Reset links expire after 60 minutes, and only the newest one works. I've sent a fresh "
              f"link to {c.masked_email()} - please use that one, and ignore any older emails.")
    if c.maybe(0.5):
        c.close()


def flow_two_factor(c: Convo) -> None:
    mode = c.pick(["lost_phone", "lost_phone", "sms"])
    if mode == "lost_phone":
        opening(c, [], ["I lost my phone and can't get the 2FA code to log in.",
                        "New phone, my authenticator app is gone. How do I get into my account?",
                        "locked out - two factor codes go to my old phone",
                        "I got a new phone and now I can't log in because of two-step verification."])
        c.bot("I'm sorry, that's a stressful one. Do you have the backup codes you were given when you "
              "turned on two-factor authentication? Each one can be used once instead of a code from your "
              "phone.")
        if c.maybe(0.4):
            c.user(c.pick(["Oh yes, I saved them somewhere. I'll try that.", "found them in my notes app"]))
            c.bot("Great. Enter one on the code screen and you'll be logged in. After that, go to Account > "
                  "Security to set up two-factor on your new phone, which also gives you a fresh set of "
                  "backup codes.")
        else:
            c.user(c.pick(["No, I never saved them.", "I don't have those", "no idea where they are"]))
            c.bot("No problem. For your security I can't turn off two-factor authentication from this chat. "
                  "I can start an account recovery request, and our security team will verify your identity "
                  "by email. Which email address is the account under?")
            c.give_email()
            c.bot(f"Thank you. I've opened a recovery request ({c.case()}). Our security team will email "
                  f"{c.masked_email()} within 1-2 business days and ask you to confirm a few details, such "
                  "as a recent order number. We will never ask for your password.")
    else:
        opening(c, [], ["I'm not getting the SMS code to log in.", "2FA text message never arrives",
                        "The verification code by SMS isn't coming through, I've tried three times."])
        last2 = "".join(c.rng.choice("0123456789") for _ in range(2))
        c.bot(f"Sorry about that. The code is sent to the number ending in {last2} - is that still your "
              "number? Codes can take up to a minute, and asking for a new one cancels the previous code, "
              "so it's best to wait 60 seconds before pressing 'Resend'.")
        if c.maybe(0.5):
            c.user(c.pick(["Yes that's my number. Ok it just came through.", "yes, trying again... got it"]))
            c.bot("Glad it worked! If SMS keeps being slow, you can switch to an authenticator app under "
                  "Account > Security - it works even without mobile signal.")
        else:
            c.user(c.pick(["No, I changed my number.", "that's my old number"]))
            c.bot(f"Thanks. For security I can't change the phone number from chat. I've opened an account "
                  f"recovery request ({c.case()}); our security team will email you within 1-2 business days "
                  "to verify your identity and update the number. We will never ask for your password.")
    if c.maybe(0.4):
        c.close()


def flow_email_change(c: Convo) -> None:
    mode = c.pick(["self_service", "self_service", "do_it_for_me", "locked_out"])
    new = c.pick(["new", "personal", "home", "mail"]) + f".{c.last.lower().replace(chr(39), '')[:4]}@example.org"
    new = new.translate(str.maketrans("éëïöüñ", "eeioun"))
    if mode == "do_it_for_me":
        c.user(c.pick([f"Please change my account email from {c.email} to {new}.",
                       f"Can you update my email to {new}? The old one is {c.email}"]))
        c.bot("For security I can't change the login email from this chat. It only takes a minute: go to "
              f"Account > Profile > Email, enter {new}, and we'll send a confirmation link there. "
              "Your email changes once you click it, and we'll also notify the old address, just in case.")
    elif mode == "self_service":
        opening(c, [], ["How do I change the email address on my account?", "I want to update my email.",
                        "I'm switching email providers - how do I change my login email?"])
        c.bot("You can do it yourself under Account > Profile > Email. Enter the new address and your "
              "current password, and we'll send a confirmation link to the new address. The change takes "
              "effect when you click it, and we'll send a notice to the old address as well.")
        if c.maybe(0.5):
            c.user(c.pick(["Will my order history stay?", "Does this affect my Trail Club membership?"]))
            c.bot("Yes, everything stays on the same account - orders, returns, membership and saved "
                  "addresses. Only the login and contact email change.")
    else:
        c.user(c.pick(["I can't log in and I no longer have access to my old email address.",
                       f"My old email {c.email} was deleted and now I'm locked out of my account."]))
        c.bot("I'm sorry, I know that's frustrating. For your security I can't change the email from chat, "
              "but I can start an account recovery request. What name and, if you know it, order number "
              "are on the account?")
        o = c.new_order("delivered", delivered_ago=c.rng.randint(20, 200))
        c.user(f"{c.first} {c.last}, one of my orders was {o.number}")
        c.bot(f"Thank you, {c.first}. I've opened a recovery request ({c.case()}). Our security team will "
              "contact you within 1-2 business days to verify your identity - please reply from the new "
              "email address you'd like to use. We will never ask for your password.")
    if c.maybe(0.45):
        c.close()


def flow_account_deletion(c: Convo) -> None:
    mode = c.pick(["delete", "delete", "export"])
    if mode == "delete":
        opening(c, [], ["Please delete my account and all my data.",
                        "I want my account deleted under GDPR.",
                        "How do I close my account? I don't want you keeping my information.",
                        "Right to erasure request: delete everything you have on me.",
                        "Delete my account please. Stop emailing me."])
        c.bot("I can help with that. Which email address is the account registered with?")
        c.give_email()
        ref = c.case()
        c.bot(f"Thank you. I've submitted a deletion request for the account under {c.masked_email()} "
              f"(reference {ref}). We'll email you to confirm the request really came from you; once you "
              "confirm, your account and personal data are deleted within 30 days. We're legally required "
              "to keep order and invoice records for tax purposes, but they aren't used for anything else. "
              "Marketing emails stop right away.")
        if c.maybe(0.5):
            c.exchange([
                ([f"Will my {CLUB} membership be cancelled too?", "Do I need to cancel my membership separately?"],
                 f"No need - deleting the account ends the {CLUB} membership, and there will be no further "
                 "charges."),
                (["What about my open return?", "I still have a return on its way, is that a problem?"],
                 "Any return that's already on its way will still be refunded to your original payment "
                 "method before the account is closed."),
                (["Can I undo it if I change my mind?", "what if i change my mind"],
                 "Until you click the confirmation link nothing is deleted. After deletion it can't be "
                 "undone, but you're always welcome to create a new account."),
            ])
    else:
        opening(c, [], ["Can I get a copy of all the data you hold about me?",
                        "I'd like to make a subject access request.",
                        "What personal data do you have on me? I want a copy (GDPR)."])
        c.bot("Of course. Which email address is your account registered with?")
        c.give_email()
        c.bot(f"Thanks. I've logged a data access request ({c.case()}). We'll email {c.masked_email()} to "
              "confirm it's you, and then send a secure download link with your data - profile, orders, "
              "returns and communication preferences - within 30 days.")
    if c.maybe(0.45):
        c.close()


def flow_double_charge(c: Convo) -> None:
    o = c.new_order("in_transit", n_items=1)
    mode = c.pick(["pending", "pending", "captured", "two_orders"])
    amount = c.money(o.total)
    has = opening(c, [
        f"I was charged twice for order {o.number}.",
        f"My card shows two charges of {amount} for {o.number}.",
        f"Double charge on {o.number}!! {amount} taken twice.",
    ], [
        f"I see two charges of {amount} from you on my bank statement.",
        "Why did you take the money twice?",
        "I've been charged twice for one order.",
        f"There are 2 payments of {amount} on my card but I only ordered once.",
    ])
    lead = lookup(c, has, purpose="check the payments")
    if mode == "pending":
        c.bot(f"{lead} I can see one payment of {amount} that was captured for this order. The second one "
              "is a temporary authorization hold from when the payment was first checked - it was never "
              "taken, and your bank will release it automatically, usually within 3-5 business days. You "
              "don't need to do anything.")
        if c.maybe(0.5):
            c.user(c.pick(["And if it's still there next week?", "What if it doesn't disappear?"]))
            c.bot(f"If the hold is still showing after 5 business days, message us with order {o.number} "
                  "and a screenshot of the two entries, and we'll send your bank a confirmation that only "
                  "one payment was taken.")
    elif mode == "captured":
        ref = c.fresh_id("RF-", 8)
        c.bot(f"{lead} You're right - the payment of {amount} was captured twice, which is our mistake. "
              f"I've refunded the duplicate payment (reference {ref}). {pay_back(c, o.total)}")
    else:
        o2 = c.fresh_id("FH-", 7)
        c.bot(f"{lead} I see two separate orders placed a few minutes apart: {o.number} and {o2}, each for "
              f"{amount}. The second one hasn't shipped yet, so I can cancel it. Would you like me to?")
        c.user(c.pick(["Yes, cancel the second one.", "yes please cancel it", "Oh! Yes, cancel it please."]))
        c.bot(f"Done - order {o2} is cancelled, and {o.number} will arrive as planned. "
              f"{pay_back(c, o.total)}")
    if c.maybe(0.5):
        c.close()


def typo_code(code: str, rng: random.Random) -> str:
    i = rng.randint(0, len(code) - 2)
    swapped = code[:i] + code[i + 1] + code[i] + code[i + 2:]
    return swapped if swapped != code else code[:-1]


def flow_promo_code(c: Convo) -> None:
    code, desc = c.pick(c.pools.promos)
    desc = desc.replace("$", c.cur)
    mode = c.pick(["expired", "min_spend", "sale", "typo", "after_checkout"])
    typed = typo_code(code, c.rng) if mode == "typo" else code
    if mode == "after_checkout":
        o = c.new_order("processing")
        c.user(c.pick([f"I forgot to use the code {code} on my order {o.number}. Can you apply it?",
                       f"Just saw the {code} code after I ordered ({o.number}) - can I still get the discount?"]))
        c.bot(f"Thanks for asking. Discount codes can only be applied at checkout, so I'm not able to add "
              f"{code} to order {o.number} afterwards, I'm sorry. If the code is still valid, you can use it "
              "on your next order.")
        if c.maybe(0.5):
            c.user(c.pick(["Could I cancel and reorder with the code?", "So if I cancel and order again it works?"]))
            c.bot(f"Yes, that works: order {o.number} hasn't shipped, so you can cancel it and place a new "
                  "order with the code. Just keep in mind stock isn't held, so items could sell out in "
                  "between. Would you like me to cancel it?")
            c.user(c.pick(["Yes, cancel it.", "ok yes"]))
            c.bot(f"Done - {o.number} is cancelled. {pay_back(c, o.total)}")
        if c.maybe(0.4):
            c.close()
        return
    opening(c, [], [f"The code {typed} isn't working.", f"Promo code {typed} says invalid at checkout.",
                    f"I tried {typed} but it won't apply to my cart.",
                    f"why doesn't {typed} work??", f"Your discount code {typed} is broken."])
    if mode == "typo":
        c.bot(f"I can't find a code called {typed} - could it be {code}? That one gives {desc}. Codes need "
              "to be typed exactly, without spaces.")
        c.user(c.pick(["Oh you're right, it works now!", "oops. yes that worked", "Ah, typo. Thanks!"]))
        c.bot("Great, glad it's sorted! Enjoy your order.")
    elif mode == "expired":
        ended = c.today - dt.timedelta(days=c.rng.randint(2, 40))
        c.bot(f"I've checked: {code} ({desc}) ended on {fmt_date(ended)}, so it can't be used anymore, I'm "
              "sorry. Current offers are listed on our Deals page.")
        if c.maybe(0.6):
            c.user(c.pick(["Can you give me another code then?", "Is there any other discount you can give me?"]))
            c.bot("I'm not able to create or hand out discount codes, sorry. Anything that's running right "
                  "now is on the Deals page, and new newsletter subscribers get a welcome code by email.")
    else:
        c.bot(f"Let me help. {code} gives {desc} on orders of {c.cur}75 or more before shipping, and it "
              "doesn't apply to items that are already on sale. I can't see your cart from here - could you "
              "tell me the subtotal and whether anything in it is discounted?")
        if mode == "min_spend":
            sub = c.rng.randint(35, 74)
            c.user(c.pick([f"Subtotal is {c.cur}{sub}, nothing on sale.", f"{c.cur}{sub}.00, all full price",
                           f"It's {c.cur}{sub} I think"]))
            c.bot(f"That explains it: the cart is {c.cur}{75 - sub} short of the {c.cur}75 minimum. Once the "
                  f"subtotal reaches {c.cur}75, the code will apply.")
        else:
            p = c.pick(c.pools.products)[0]
            c.user(c.pick([f"Total is about {c.cur}140, the {p} is 30% off.", f"the {p} is on sale, yes"]))
            c.bot(f"That's the reason: {code} doesn't apply to sale items, so the discounted {p} is excluded. "
                  "If you have other full-price items over the minimum, the code will apply to those.")
    if c.maybe(0.4):
        c.close()


def flow_subscription_cancel(c: Convo) -> None:
    plan = c.pick(["monthly", "annual_recent", "annual_old"])
    opening(c, [], [f"I want to cancel my {CLUB} membership.", f"How do I stop my {CLUB} subscription?",
                    f"Please cancel my {CLUB} - I don't use it enough.",
                    "Cancel my subscription please, you charged me again.",
                    f"I'd like to end the {CLUB} membership before it renews."])
    c.bot(c.pick(["I can help with that.", "Sure.", "Of course."]) +
          " Which email address is the membership under?")
    c.give_email()
    if plan == "monthly":
        end = c.today + dt.timedelta(days=c.rng.randint(3, 27))
        c.bot(f"Thanks. You're on the monthly {CLUB} plan ({c.cur}5.99 a month), paid up until "
              f"{fmt_date(end)}. If I cancel, auto-renewal stops and you keep free express shipping and "
              "member prices until then, with no further charges. Shall I cancel it?")
    elif plan == "annual_recent":
        renewed = c.today - dt.timedelta(days=c.rng.randint(1, 13))
        c.bot(f"Thanks. Your annual {CLUB} membership ({c.cur}49) renewed on {fmt_date(renewed)}. Because "
              "that's within the last 14 days and no member benefits have been used since, I can cancel it "
              f"and refund the {c.cur}49 in full. Shall I go ahead?")
    else:
        end = c.today + dt.timedelta(days=c.rng.randint(30, 300))
        c.bot(f"Thanks. Your annual {CLUB} membership ({c.cur}49) runs until {fmt_date(end)}. If I cancel "
              "now, it won't renew, and you keep the benefits until that date. Since the renewal was more "
              "than 14 days ago, I can't refund the remaining months. Shall I turn off the renewal?")
    c.user(c.pick(["Yes please.", "yes cancel it", "Go ahead.", "Yes. Thanks."]))
    tail = (f"Your {c.cur}49 refund goes back to the card it was paid with within 5-7 business days."
            if plan == "annual_recent" else "You won't be charged again.")
    c.bot(f"Done - your {CLUB} membership is cancelled and a confirmation email is on its way. {tail} "
          "You can rejoin any time from your account page.")
    if c.maybe(0.35):
        c.close()


def flow_warranty_claim(c: Convo) -> None:
    mode = c.pick(["covered", "covered", "covered", "expired", "accident"])
    ago = {"covered": c.rng.randint(60, 690), "expired": c.rng.randint(760, 1100),
           "accident": c.rng.randint(40, 400)}[mode]
    o = c.new_order("delivered", delivered_ago=ago, n_items=1)
    defect = c.pick(product_issues(o.product, o.kind)[0])
    if mode == "accident":
        defect = c.pick(["I dropped it off a ledge and it broke", "it melted a bit near the campfire",
                         "my dog chewed through a strap"])
    has = opening(c, [
        f"My {o.product} from order {o.number} is broken - {defect}. Is it under warranty?",
        f"Warranty claim for {o.number}: {defect}.",
        f"I bought the {o.product} last year ({o.number}) and {defect}. What can you do?",
    ], [
        f"My {o.product} is faulty - {defect}. Can I get it fixed?",
        f"Is the {o.product} covered by warranty? {defect[0].upper() + defect[1:]}.",
        f"I'd like to make a warranty claim, {defect}.",
    ])
    lead = lookup(c, has, purpose="check the warranty", reply_sorry=mode == "covered")
    if mode == "covered":
        claim = c.fresh_id("WR-", 6)
        c.bot(f"{lead} It was delivered on {fmt_date(o.delivered)}, {o.delivered.year}, so it's within our "
              "2-year warranty, and what you describe sounds like a manufacturing defect. I've opened warranty claim "
              f"{claim} and emailed a link to {c.masked_email()} to upload photos of the problem. Our team "
              "reviews claims within 3-5 business days and will offer a repair, a replacement or store "
              "credit.")
        if c.maybe(0.5):
            c.exchange([
                (["Do I need to send it in?", "Should I post it to you?"],
                 "Not yet - please hold on to it until the team has looked at the photos. If they need the "
                 "item, they'll send you a free shipping label."),
                (["Can I keep using it meanwhile?", "Is it ok to keep using it for now?"],
                 "That's up to you, but please don't try to repair it yourself - a home repair can make it "
                 "harder for the team to assess. If they need the item, they'll send a free shipping label."),
            ])
    elif mode == "expired":
        c.bot(f"{lead} I'm sorry to hear that. It was delivered on {fmt_date(o.delivered)}, "
              f"{o.delivered.year}, which is more than 2 years ago, so it's outside our warranty period and "
              "I'm not able to open a claim.")
    else:
        c.bot(f"{lead} I'm sorry that happened. Our 2-year warranty covers manufacturing defects, but not "
              "damage from accidents or wear and tear, so I can't open a warranty claim for this. If you "
              "think there was also a defect involved, I can ask our team to take a look.")
    if c.maybe(0.5):
        c.close()


def flow_escalation_human(c: Convo) -> None:
    opening(c, [], ["Can I speak to a human please?", "I want to talk to a real person.",
                    "agent", "Is there a person I can talk to? Not a bot.",
                    "Please transfer me to customer service staff."])
    c.bot("Of course - I'll pass you to our Customer Care team. So they can help straight away, could "
          "you tell me briefly what it's about, and the order number if there is one?")
    case = c.case()
    hours = f"our phone line is {PHONE}, Monday to Friday, 8am-6pm ET"
    if c.maybe(0.6):
        o = c.new_order("delivered", delivered_ago=c.rng.randint(1, 20))
        topic = c.pick([f"a problem with my {o.product}", "an issue with my refund",
                        "a complaint about delivery", f"the {o.product} I bought"])
        c.user(c.pick([f"It's about {topic}, order {o.number}.", f"{o.number}, {topic}",
                       f"Order {o.number}. It's about {topic} and I'd rather explain to a person."]))
        c.bot(f"Thank you. I've passed this to our Customer Care team with case number {case}, including "
              f"order {o.number}. A member of the team will reply by email within 1 business day. If you'd "
              f"prefer to call, {hours} - mention the case number.")
    else:
        c.user(c.pick(["I just want a person.", "I'd rather not explain it to a bot.", "No, just a human."]))
        c.bot(f"Understood. I've requested a handoff to our Customer Care team (case {case}). A member of the "
              f"team will reply by email within 1 business day, or you can call - {hours}.")
    if c.maybe(0.4):
        c.close()


def flow_escalation_legal(c: Convo) -> None:
    c.tone = "angry"
    o = c.new_order("delivered", delivered_ago=c.rng.randint(15, 60), n_items=1)
    threat = c.pick(["I'm contacting my lawyer", "I'll see you in small claims court",
                     "I'm reporting you to consumer protection", "I'll sue",
                     "I'm filing a chargeback and a complaint with the trading standards office"])
    problem = c.pick(["I still haven't got my refund", "you sent me a broken item and ignored me",
                      "you charged me for something I never received"])
    has = opening(c, [
        f"{problem[0].upper() + problem[1:]} for order {o.number}. {threat}.",
        f"This is unacceptable. Order {o.number}: {problem}. {threat} if this isn't fixed today.",
    ], [
        f"{problem[0].upper() + problem[1:]}. {threat}.",
        f"Fix this now or {threat.lower()}. {problem[0].upper() + problem[1:]}.",
    ])
    case = c.case()
    sorry = c.pick(["I'm sorry this has reached this point, and I understand you're frustrated.",
                    "I'm sorry for the experience you've had, and I understand why you're upset.",
                    "I understand you're frustrated, and I'm sorry it has come to this."])
    if has:
        c.bot(f"{sorry} I've looked up order {o.number}. I'm not able to comment on legal matters, but "
              f"I've escalated your case to our Customer Relations team, who handle formal complaints "
              f"(case {case}). They'll contact you by email within 1 business day with a full review.")
    else:
        c.bot(f"{sorry} I'm not able to comment on legal matters, but I'll escalate this to our Customer "
              "Relations team, who handle formal complaints. Could you give me your order number so they have "
              "everything they need?")
        c.give_order()
        c.bot(f"Thank you. I've escalated order {o.number} to Customer Relations (case {case}). They'll "
              "contact you by email within 1 business day with a full review.")
    if c.maybe(0.5):
        c.user(c.pick(["Why can't you just fix it yourself?", "One day?! I want it fixed now.",
                       "So you're just passing the buck."]))
        c.bot("I understand you want this resolved quickly. Because you've raised a formal complaint, it "
              "has to go to the team that can review the whole history and make a decision - I don't want to "
              "give you an answer I can't stand behind. Your case is marked urgent, and you'll have a reply "
              f"within 1 business day. You can also call {PHONE} with case {case}.")
    if c.maybe(0.3):
        c.close()


def flow_escalation_repeated(c: Convo) -> None:
    c.tone = c.pick(["angry", "angry", "neutral"])
    o = c.new_order("delivered", delivered_ago=c.rng.randint(20, 45), n_items=1)
    nth = c.pick(["third", "fourth", "second"])
    issue = c.pick(["my missing refund", "the replacement that never came", "the wrong item I got",
                    "my return that you say you never received"])
    old_case = c.fresh_id("CS-", 6)
    has = opening(c, [
        f"This is the {nth} time I'm contacting you about {issue} for order {o.number}.",
        f"I've already been told twice this would be sorted. Order {o.number}, case {old_case}. Still nothing.",
        f"Order {o.number}: {nth} message about {issue}. Every time I'm told to wait.",
    ], [
        f"This is the {nth} time I'm contacting you about {issue}.",
        f"I've been promised twice that {issue} would be fixed and nothing has happened.",
    ])
    if not has:
        c.bot(f"{c.sorry()} I don't want you to have to explain everything again. Could you share the order "
              "number so I can see the history?")
        c.give_order()
    case = c.case()
    c.bot(f"{c.sorry() if has else 'Thank you.'} I can see order {o.number} has had more than one contact "
          "without a resolution. Rather than repeat the same steps, I've escalated it to a senior member of "
          f"our Customer Care team as a priority (case {case}). They'll contact you by email within 1 "
          "business day, and they can approve things I can't.")
    if c.maybe(0.5):
        c.exchange([
            (["Can't you do anything now?", "Why can't you fix it yourself?"],
             "I could restart the same process, but it hasn't worked before and I don't want to waste more "
             "of your time. The senior team can see the full history and make a decision in one go."),
            (["What exactly will they do?", "And what will they actually do about it?"],
             "I can't promise a specific outcome on their behalf, but they'll review the whole history and "
             "come back with a concrete fix rather than another waiting period."),
            (["And if they don't get back to me?", "What if nobody contacts me again?"],
             f"If you haven't heard back within 1 business day, call {PHONE} and give case {case} - it's "
             "flagged as a priority, so you'll go straight to the senior team."),
        ])
    if c.maybe(0.4):
        c.close()


INTENTS = {
    # name: (category, generator, weight out of 600 training rows)
    "order_status": ("orders", flow_order_status, 50),
    "cancel_order": ("orders", flow_cancel_order, 34),
    "address_change": ("orders", flow_address_change, 28),
    "late_delivery": ("delivery", flow_late_delivery, 38),
    "lost_package": ("delivery", flow_lost_package, 32),
    "wrong_item": ("delivery", flow_wrong_item, 32),
    "damaged_item": ("delivery", flow_damaged_item, 32),
    "return_request": ("returns & refunds", flow_return_request, 48),
    "refund_status": ("returns & refunds", flow_refund_status, 32),
    "warranty_claim": ("returns & refunds", flow_warranty_claim, 28),
    "password_reset": ("accounts", flow_password_reset, 30),
    "two_factor": ("accounts", flow_two_factor, 24),
    "email_change": ("accounts", flow_email_change, 22),
    "account_deletion": ("accounts", flow_account_deletion, 24),
    "double_charge": ("billing", flow_double_charge, 28),
    "promo_code": ("billing", flow_promo_code, 30),
    "subscription_cancel": ("billing", flow_subscription_cancel, 24),
    "escalation_human": ("escalation", flow_escalation_human, 26),
    "escalation_legal": ("escalation", flow_escalation_legal, 20),
    "escalation_repeated": ("escalation", flow_escalation_repeated, 18),
}


# ---------------------------------------------------------------------------------------------
# Building the splits.
# ---------------------------------------------------------------------------------------------

SYSTEM_SHARE = 0.85  # the rest of the rows have no system message
WORD_RANGE = (50, 350)  # words per conversation, system message included


def quotas(n: int) -> dict[str, int]:
    """Split n rows over the intents in proportion to their weights (largest remainder)."""
    total = sum(w for _, _, w in INTENTS.values())
    exact = {name: n * w / total for name, (_, _, w) in INTENTS.items()}
    counts = {name: int(x) for name, x in exact.items()}
    by_remainder = sorted(exact, key=lambda name: (-(exact[name] - counts[name]), name))
    for name in by_remainder[: n - sum(counts.values())]:
        counts[name] += 1
    return counts


def conversation_words(row: dict) -> int:
    return sum(words(m["content"]) for m in row["messages"])


def well_formed(row: dict) -> bool:
    msgs = row["messages"]
    if msgs and msgs[0]["role"] == "system":
        msgs = msgs[1:]
    roles = [m["role"] for m in msgs]
    exchanges = len(roles) // 2
    return (len(roles) % 2 == 0 and 1 <= exchanges <= 4
            and roles == ["user", "assistant"] * exchanges
            and all(m["content"].strip() for m in row["messages"]))


def serialize(row: dict) -> str:
    return json.dumps(row, ensure_ascii=False)


def one_conversation(rng: random.Random, pools: Pools, used_ids: set, intent: str) -> dict:
    c = Convo(rng, pools, used_ids)
    if c.maybe(0.06):
        c.user(c.pick(["hi", "Hello?", "Hi there 👋", "hey", "Good afternoon"]))
        c.bot(c.pick([f"Hi! Thanks for contacting {COMPANY}. How can I help you today?",
                      "Hello! What can I help you with today?"]))
    INTENTS[intent][1](c)
    return c.to_row(with_system=c.maybe(SYSTEM_SHARE))


class Split(NamedTuple):
    lines: list[str]  # serialized rows
    intents: list[str]  # the intent of each row
    discarded: int  # candidates thrown away: malformed, duplicate, or outside WORD_RANGE


def generate_split(split: str, n: int, used_ids: set, seen: set) -> Split:
    """`seen` holds every row of earlier splits, so no row is repeated within or across splits."""
    rng = random.Random(SEED + (0 if split == "train" else 1_000_003))
    pools = Pools(split)
    schedule = [name for name, q in quotas(n).items() for _ in range(q)]
    rng.shuffle(schedule)
    lines, intents, discarded = [], [], 0
    for intent in schedule:
        for _ in range(100):
            row = one_conversation(rng, pools, used_ids, intent)
            line = serialize(row)
            lo, hi = WORD_RANGE
            if well_formed(row) and line not in seen and lo <= conversation_words(row) <= hi:
                break
            discarded += 1
        else:
            raise RuntimeError(f"could not generate a valid {intent} conversation for {split}")
        seen.add(line)
        lines.append(line)
        intents.append(intent)
    return Split(lines, intents, discarded)


def build() -> dict[str, Split]:
    used_ids: set = set()
    seen: set = set()
    splits = {name: generate_split(name, n, used_ids, seen) for name, n in SPLITS}
    verify(splits)
    return splits


def verify(splits: dict[str, Split]) -> None:
    """Fail loudly if the splits overlap or a row breaks the schema."""
    train, held_out = Pools("train"), Pools("eval")
    for attr in ("first", "last", "products", "promos", "streets"):
        shared = [x for x in getattr(held_out, attr) if x in getattr(train, attr)]
        if shared:
            raise AssertionError(f"eval pool {attr} overlaps train: {shared}")
    all_lines = [line for split in splits.values() for line in split.lines]
    if len(set(all_lines)) != len(all_lines):
        raise AssertionError("duplicate rows within or across splits")
    train_text = "\n".join(splits["train"].lines)
    for line in splits["eval"].lines:
        for ident in re.findall(r"\b(?:FH|CS|RF|WR)-\d+\b", line):
            if ident in train_text:
                raise AssertionError(f"eval identifier {ident} also appears in train")
    for split in splits.values():
        for line in split.lines:
            row = json.loads(line)
            if list(row) != ["messages"] or not well_formed(row):
                raise AssertionError(f"malformed row: {line[:120]}")


# ---------------------------------------------------------------------------------------------
# Statistics for the README.
# ---------------------------------------------------------------------------------------------


def percentile(sorted_values: list[int], q: float) -> int:
    """Nearest-rank percentile."""
    rank = max(1, -(-len(sorted_values) * q // 100))
    return sorted_values[int(rank) - 1]


def stats_markdown(splits: dict[str, Split]) -> str:
    names = [name for name, _ in SPLITS]
    rows = {name: [json.loads(line) for line in splits[name].lines] for name in names}
    out = [f"Seed `{SEED}`. Numbers below are computed by the generator from the files it writes.", ""]

    out += ["| | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    out.append("| rows | " + " | ".join(str(len(rows[n])) for n in names) + " |")
    out.append("| rows with a system message | " + " | ".join(
        str(sum(r["messages"][0]["role"] == "system" for r in rows[n])) for n in names) + " |")
    for k in range(1, 5):
        out.append(f"| rows with {k} user/assistant exchange{'s' if k > 1 else ''} | " + " | ".join(
            str(sum(1 for r in rows[n] if sum(m["role"] == "user" for m in r["messages"]) == k))
            for n in names) + " |")
    out.append("| rows with non-ASCII text (é, €, £, emoji, ...) | " + " | ".join(
        str(sum(1 for line in splits[n].lines if not line.isascii())) for n in names) + " |")
    out.append("| rows with an emoji | " + " | ".join(
        str(sum(1 for line in splits[n].lines if re.search(r"[\U0001F300-\U0001FAFF]", line)))
        for n in names) + " |")
    eval_openings = [next(m["content"] for m in r["messages"] if m["role"] == "user") for r in rows["eval"]]
    train_openings = {next(m["content"] for m in r["messages"] if m["role"] == "user") for r in rows["train"]}
    out.append("| generated candidates discarded (duplicate, or outside "
               f"{WORD_RANGE[0]}-{WORD_RANGE[1]} words) | " + " | ".join(
                   str(splits[n].discarded) for n in names) + " |")
    out.append(f"| eval rows whose first user message also occurs in train | - | "
               f"{sum(1 for o in eval_openings if o in train_openings)} |")
    out.append("")

    out += ["Words per conversation (whitespace-separated, all messages including the system message):", "",
            "| split | min | p10 | p25 | p50 | p75 | p90 | p99 | max | mean |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for n in names:
        w = sorted(conversation_words(r) for r in rows[n])
        cells = [str(w[0])] + [str(percentile(w, q)) for q in (10, 25, 50, 75, 90, 99)] + [str(w[-1])]
        out.append(f"| {n} | " + " | ".join(cells) + f" | {sum(w) / len(w):.1f} |")
    out.append("")

    out += ["Intents (the intent is not stored in the rows; it is listed here for reference):", "",
            "| category | intent | " + " | ".join(names) + " |", "|---|---|" + "---:|" * len(names)]
    for intent, (category, _, _) in INTENTS.items():
        out.append(f"| {category} | `{intent}` | " + " | ".join(
            str(splits[n].intents.count(intent)) for n in names) + " |")
    return "\n".join(out)


def example_markdown(splits: dict[str, Split]) -> str:
    """The first short two-exchange eval row with a system message, pretty-printed."""
    for line in splits["eval"].lines:
        row = json.loads(line)
        users = sum(m["role"] == "user" for m in row["messages"])
        if users == 2 and row["messages"][0]["role"] == "system" and len(line) < 1300 and "FH-" in line:
            return "```json\n" + json.dumps(row, ensure_ascii=False, indent=2) + "\n```"
    raise AssertionError("no example row found in eval")


def readme_text(current: str, splits: dict[str, Split]) -> str:
    """The README with its generated sections replaced."""
    content = {"example": example_markdown(splits), "stats": stats_markdown(splits)}
    for name in GENERATED_SECTIONS:
        begin = f"<!-- {name}:begin (generated by scripts/make_customer_service_data.py) -->"
        end = f"<!-- {name}:end -->"
        start, stop = current.index(begin) + len(begin), current.index(end)
        current = current[:start] + "\n" + content[name] + "\n" + current[stop:]
    return current


# ---------------------------------------------------------------------------------------------


def outputs(splits: dict[str, Split]) -> dict[Path, str]:
    files = {OUT_DIR / f"{name}.jsonl": "".join(line + "\n" for line in splits[name].lines) for name, _ in SPLITS}
    files[README] = readme_text(README.read_text(encoding="utf-8"), splits)
    return files


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="regenerate in memory and exit 1 if the committed files differ")
    args = parser.parse_args()
    files = outputs(build())
    if args.check:
        stale = [p for p, text in files.items()
                 if not p.exists() or p.read_bytes() != text.encode("utf-8")]
        for p in stale:
            print(f"differs from a fresh generation: {p.relative_to(ROOT)}", file=sys.stderr)
        if not stale:
            print("ok: dataset files match a fresh generation")
        return 1 if stale else 0
    for p, text in files.items():
        p.write_bytes(text.encode("utf-8"))
        print(f"wrote {p.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
