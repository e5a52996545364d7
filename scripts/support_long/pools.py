"""Entity pools, identifiers and user noise. Every pool is split train/eval (held-out entities)."""

import string

COMPANY = "Larkspur Networks"
APP = "Larkspur Home"
SUPPORT_EMAIL = "help@larkspur.example"
SUPPORT_PHONE = "+1 555-0142"

MODELS = ["HX3", "HX5", "HX5 Pro", "HX7 Max"]
SATELLITES = ["S1 satellite", "S2 satellite", "Beacon extender"]
ISPS_ALL = ["Brightwave Fibre", "Northline Cable", "Kestrel Broadband", "Tidewater Telecom",
            "Copperleaf DSL", "Orbitnet", "Silverbirch Fibre", "Granite Peak Wireless",
            "Harbourlight Net", "Quillfield Broadband"]
FIRST_ALL = ["Aisha", "Ben", "Carla", "Dmitri", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jonas",
             "Kemi", "Liam", "Maya", "Nikhil", "Olga", "Pedro", "Quinn", "Rosa", "Sven", "Tariq",
             "Uma", "Victor", "Wen", "Ximena", "Yusuf", "Zoe", "Amara", "Bruno", "Chloe", "Diego",
             "Esther", "Felix", "Greta", "Hamid", "Isla", "Joaquín", "Kasia", "Leon", "Mei", "Noor",
             "Oskar", "Priya", "Rafael", "Saoirse", "Tomás", "Valentina", "Wiktor", "Yara"]
LAST_ALL = ["Abara", "Brennan", "Castillo", "Dubois", "Eriksen", "Fontaine", "Gallagher", "Hoffmann",
            "Ivanova", "Jaramillo", "Kowalski", "Lindqvist", "Moreau", "Nakamura", "Okafor", "Petrov",
            "Quintero", "Rasmussen", "Sato", "Tanaka", "Umarov", "Vasquez", "Whitfield", "Yilmaz",
            "Zielinski", "Achterberg", "Byrne", "Czerny", "Delacroix", "Esposito", "Fairweather",
            "Grünewald", "Haddad", "Ishikawa", "Jovanović", "Kaur", "Lefebvre", "Mbeki"]
SSID_ALL = ["HomeNet", "TheShire", "Casa-Wifi", "FBI_Van_3", "NetGoesBrrr", "Lighthouse", "attic-ap",
            "PrettyFlyForAWifi", "Hearth", "Oakview5G", "Saltbox", "BlueHeron", "HalfLife3", "Nook",
            "Riverside-Guest", "Pumpkin", "StudioLan", "Wombat", "Bramble", "Cedar-2G"]
CLIENTS_ALL = ["maya-laptop", "LivingRoom-TV", "ps5-den", "iPad-kids", "Galaxy-S23", "thermostat",
               "desktop-work", "NAS-01", "printer-office", "Pixel-8", "echo-kitchen", "xbox-series",
               "MacBook-Air", "doorbell-cam", "ThinkPad-T14", "fridge-panel", "kindle", "switch-oled",
               "raspberrypi", "homeassistant", "Chromebook-school", "desk-phone"]
COMPANIES_ALL = ["Fernleaf Dental", "Oakmoor Accounting", "Pinecrest Studio", "Bluefin Cafe",
                 "Harrow & Vale Legal", "Sunward Yoga", "Marlow Print Shop", "Tinker Robotics Club",
                 "Copper Kettle Bakery", "Northgate Physio", "Juniper Architects", "Redwing Garage"]
PLANS = ["Shield Basic", "Shield Plus", "Shield Family", "Shield Business"]
PRICES = {"Shield Basic": "4.99", "Shield Plus": "7.99", "Shield Family": "9.99", "Shield Business": "24.00"}


def split_pool(pool, every=5):
    """Every `every`-th entry (from index 2) is held out for eval."""
    ev = [x for i, x in enumerate(pool) if i % every == 2]
    tr = [x for i, x in enumerate(pool) if i % every != 2]
    return tr, ev


POOL_NAMES = ["ISPS", "FIRST", "LAST", "SSID", "CLIENTS", "COMPANIES"]


def pools(split):
    out = {}
    for name in POOL_NAMES:
        tr, ev = split_pool(globals()[name + "_ALL"])
        out[name] = tr if split == "train" else ev
    return out


def check_disjoint():
    for name in POOL_NAMES:
        tr, ev = split_pool(globals()[name + "_ALL"])
        assert not set(tr) & set(ev) and tr and ev, name


ALNUM = string.ascii_letters + string.digits


def call_id(rng):
    return "".join(rng.choice(ALNUM) for _ in range(9))


def mac(rng, private=False):
    first = rng.choice(["3c", "a4", "d8", "f0", "5c", "b8"]) if not private else rng.choice(["2a", "6e", "ba", "fe"])
    return ":".join([first] + ["%02x" % rng.randrange(256) for _ in range(5)])


def lan_ip(rng, net="192.168.1"):
    return "%s.%d" % (net, rng.randrange(20, 240))


def doc_ip(rng):
    return "%s.%d" % (rng.choice(["192.0.2", "198.51.100", "203.0.113"]), rng.randrange(2, 250))


class Person:
    def __init__(self, rng, p):
        self.first = rng.choice(p["FIRST"])
        self.last = rng.choice(p["LAST"])
        self.customer_id = "LK-%06d" % rng.randrange(100000, 999999)
        dom = rng.choice(["example.com", "example.org", "example.net"])
        self.email = "%s.%s@%s" % (ascii_fold(self.first).lower(), ascii_fold(self.last).lower(), dom)
        self.phone = "555-01%02d" % rng.randrange(100)
        self.isp = rng.choice(p["ISPS"])
        self.ssid = rng.choice(p["SSID"])
        self.clients = rng.sample(p["CLIENTS"], 4)
        self.company = rng.choice(p["COMPANIES"])
        self.model = rng.choice(MODELS)
        self.serial = "%s-%s" % (self.model.split()[0], "".join(rng.choice("0123456789ABCDEF") for _ in range(8)))
        self.hostname = rng.choice(["hx-living", "router", "hx-hall", "larkspur-main", "gw-office", "hx-study"])
        self.fw = "%d.%d.%d" % (rng.choice([3, 4]), rng.randrange(0, 9), rng.randrange(0, 30))
        self.fw_new = "%s.%d" % (self.fw.rsplit(".", 1)[0], int(self.fw.rsplit(".", 1)[1]) + rng.randrange(1, 5))
        self.wan_ip = doc_ip(rng)
        self.plan = rng.choice(PLANS)


FOLD = str.maketrans("áéíóúñüöçćšžłąę", "aeiounuoccszlae")


def ascii_fold(s):
    return s.translate(FOLD).replace("ß", "ss")


# ---- user noise ----

def typo(rng, text, rate=0.04):
    words = text.split(" ")
    for i, w in enumerate(words):
        if len(w) > 4 and w.isalpha() and rng.random() < rate:
            j = rng.randrange(1, len(w) - 2)
            words[i] = w[:j] + w[j + 1] + w[j] + w[j + 2:]
    return " ".join(words)


SHORT = [("please", "pls"), ("thanks", "thx"), ("you", "u"), ("because", "bc"), ("though", "tho"),
         ("really", "rly"), ("don't", "dont"), ("I'm", "im"), ("it's", "its"), ("can't", "cant")]


def noisy(rng, text, style):
    """style: 0 clean, 1 light typos, 2 lowercase + shorthand + typos."""
    if style == 0:
        return text
    text = typo(rng, text, 0.03 if style == 1 else 0.06)
    if style == 2:
        text = text.lower()
        for a, b in SHORT:
            text = text.replace(a.lower(), b)
        if rng.random() < 0.5:
            text = text.replace(". ", " ").rstrip(".")
    return text
