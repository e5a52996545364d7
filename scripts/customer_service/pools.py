"""Constants, entity pools (split into disjoint train / eval parts), dates and product words."""

from __future__ import annotations

import datetime as dt
import random
from pathlib import Path

SEED = 20250611
ROOT = Path(__file__).resolve().parent.parent.parent
OUT_DIR = ROOT / "datasets" / "customer-service"
README = OUT_DIR / "README.md"
SPLITS = (("train", 600), ("eval", 80))
# README sections between "<!-- NAME:begin ... -->" and "<!-- NAME:end -->" are rewritten by this script.
GENERATED_SECTIONS = ("example", "stats")

COMPANY = "Fernhollow Outfitters"
SUPPORT_EMAIL = "support@fernhollow.example"
PHONE = "+1 (555) 010-2486"  # 555-01xx numbers are reserved for fiction
CLUB = "Trail Club"
EVAL_PROMPTS = OUT_DIR / "eval_prompts.jsonl"
TOOLS_FILE = OUT_DIR / "tools.json"

# ---------------------------------------------------------------------------------------------
# Entity pools. They are split into disjoint train / eval parts (see `Pools`), so the eval
# conversations mention people, products and codes the training set never saw.
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
CARRIERS = [("Swiftline Parcel", "SWL", 9), ("Meridian Post", "MP", 9), ("Cobalt Express", "CBX", 8)]
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


CURRENCY_CODE = {"$": "USD", "£": "GBP", "€": "EUR"}


def phrasing_indices(n: int, split: str) -> list[int]:
    """Which of n alternative user phrasings a split may use. In a list of 3 or more, every
    index i with i % 4 == 2 is held out for eval, and eval uses only those; shorter lists are
    shared by both splits."""
    if n < 3:
        return list(range(n))
    held = [i for i in range(n) if i % 4 == 2]
    return held if split == "eval" else [i for i in range(n) if i % 4 != 2]
