"""Turns an intent's cause into evidence text of a given size (log lines, config, trace, e-mails,
tool results) and the values the assistant may quote from it."""

import json

from . import logs
from .pools import APP, PRICES, mac, lan_ip

GENERIC_NOTES = [
    "Settings changed in the {app} app and in the web interface at http://192.168.1.1 are the same settings; a change in one shows in the other.",
    "Keep the firmware up to date (Settings > Firmware); many fixes for stability and security ship that way.",
    "A factory reset erases all settings; export a backup first under Settings > Backup.",
    "The router keeps about 72 hours of log in memory; the log is cleared when the router restarts unless Persistent log is on.",
    "Support can read your device log only while Remote diagnostics is on (Settings > Privacy).",
    "Times in the log are in UTC unless a time zone is set under Settings > Time zone.",
    "The status light is white when online, blue while starting or pairing, amber for a notice and red when there is no internet.",
    "The web interface works from any browser on your network; the default address is http://192.168.1.1.",
    "Satellites inherit Wi-Fi settings from the router; there is nothing to set on them separately.",
    "If you changed the router's LAN address, use that address instead of 192.168.1.1.",
]
FAQ = [
    ("Will I lose my settings?", "No. None of these steps erases settings; only a factory reset does."),
    ("Do I need to restart the router?", "Only where a step says so; most changes apply when you save them."),
    ("Does this apply to satellites too?", "Satellites follow the router's settings; apply the steps on the router."),
    ("What if none of this helps?", "Contact support with the time of the problem so that the log can be checked."),
    ("Can I do this from the web interface?", "Yes, every setting in the app is also in the web interface at http://192.168.1.1."),
    ("Is my data affected?", "No, these steps change router settings only."),
]


def fmt(s, F):
    return s.format(**F) if isinstance(s, str) else s


def kb_text(rng, it, cause, F, extra):
    kb_id, title, intro = it["kb"]
    notes = [fmt(n, F) for n in rng.sample(GENERIC_NOTES, min(len(GENERIC_NOTES), extra // 2))]
    text = logs.kb_article(rng, kb_id, title, intro, [fmt(s, F) for s in it["kb_steps"] or cause["steps"]], notes)
    if extra >= 3:
        qa = rng.sample(FAQ, min(len(FAQ), extra - 2))
        text += "\n\nFrequently asked:\n" + "\n".join("Q: %s\nA: %s" % q for q in qa)
    return text


def kb_search_result(rng, it, cause, F, extra, others):
    """Text of a knowledge-base search: the matching article first, then 0-3 others."""
    parts = ["[1] %s (score %.2f)\n%s" % (it["kb"][0], rng.uniform(0.82, 0.97), kb_text(rng, it, cause, F, extra))]
    for i, o in enumerate(others):
        parts.append("[%d] %s (score %.2f)\n%s" % (i + 2, o["kb"][0], rng.uniform(0.31, 0.6),
                                                  kb_text(rng, o, o["causes"][0], F, max(0, extra - 3))))
    return "\n\n---\n\n".join(parts)


def key_lines(cause, F):
    return [fmt(k, F) if isinstance(k, str) else {a: fmt(b, F) for a, b in k.items()} for k in cause["keys"]]


def syslog_evidence(rng, p, it, cause, F, n, clock=None):
    text, quoted = logs.syslog(rng, p, n, key_lines(cause, F), clock)
    for i, q in enumerate(quoted):
        F["q%d" % i] = q
        F["t%d" % i] = " ".join(q.split()[:3])
    return text


def json_evidence(rng, p, it, cause, F, n):
    text, quoted = logs.json_events(rng, p, n, key_lines(cause, F))
    return text


def speedtest_evidence(rng, p, it, cause, F, n):
    if "100Mbps" in cause["keys"][0]:
        csv = logs.speedtests(rng, max(3, n), (86, 94), (20, 40))
    else:
        csv = logs.speedtests(rng, max(3, n), (55, 92), (8, 30)).replace("wired", "2.4GHz")
    log, quoted = logs.syslog(rng, p, max(2, n // 3), key_lines(cause, F))
    F["q0"] = quoted[0]
    return csv, log


def config_evidence(rng, p, it, cause, F, n):
    key = key_lines(cause, F)[0]
    F["q0"] = key
    if it["key"] == "vpn_setup":
        peers = []
        for i in range(max(1, n // 6)):
            peers += ["", "[Peer]", "# %s" % rng.choice(p.clients), "PublicKey = %s" % logs.fake_key(rng),
                      "AllowedIPs = 10.8.0.%d/32" % (i + 2)]
        server = ["# server (router)", "[Interface]", "Address = 10.8.0.1/24", "ListenPort = %s" % F["port"],
                  "PrivateKey = %s" % logs.fake_key(rng)] + peers
        client = ["# client (%s)" % p.clients[0], "[Interface]", "Address = 10.8.0.2/32", "PrivateKey = %s" % logs.fake_key(rng),
                  "DNS = 192.168.1.1", "", "[Peer]", "PublicKey = %s" % logs.fake_key(rng),
                  key if key.startswith("AllowedIPs") else "AllowedIPs = 10.8.0.0/24, 192.168.1.0/24",
                  key if key.startswith("Endpoint") else "Endpoint = vpn.example.net:%s" % F["port"], "PersistentKeepalive = 25"]
        out = "\n".join(server) + "\n\n" + "\n".join(client)
        if key.startswith("WAN"):
            out = "Router status:\n%s\nUptime: %d days\nFirmware: %s\n\n" % (key, rng.randrange(1, 90), p.fw) + out
        return out
    extra = ["[port_forwarding]"]
    if "pppoe" in key:
        extra = ["[wan_status]", key_lines(cause, F)[1], key, ""] + extra
        F["q1"] = key_lines(cause, F)[1]
        extra.append("rule.0 = name=server proto=tcp ext=%s int=%s to=192.168.1.20" % (F["port"], F["port"]))
    else:
        extra.append(key)
    for i in range(1, max(1, n // 8)):
        extra.append("rule.%d = name=%s proto=tcp ext=%d int=%d to=%s" % (
            i, rng.choice(["cam", "nas", "web", "ssh-alt"]), rng.randrange(8000, 9999), rng.randrange(80, 9000), lan_ip(rng)))
    cfg = logs.config_export(rng, p, extra, n)
    if "proto=tcp ext" in key:
        cfg = cfg.replace("[dhcp]\n", "[dhcp]\nreservation.server = %s 192.168.1.%d server\n" % (mac(rng), int(F["r5"]) + 7))
    return cfg


def trace_evidence(rng, p, it, cause, F, n):
    k = key_lines(cause, F)
    F["q0"], F["q1"] = k[0], k[1]
    lang = rng.choice(["python", "java"])
    exc = ("requests.exceptions." if lang == "python" else "com.example.msp.api.") + k[0]
    F["q0"] = exc
    traces = []
    for _ in range(max(1, n // 14)):
        traces.append(logs.stack_trace(rng, lang, exc, k[1], rng.randrange(2, 6)))
    head = "\n".join("%s INFO sync site %d/%s ok (%d devices)" % (logs.Clock(rng).iso(), i + 1, F["n_sites"], rng.randrange(2, 40))
                     for i in range(max(0, n // 3)))
    return (head + "\n" if head else "") + "\n\n".join(traces)


def account_json(rng, p, cause, F, n):
    price = PRICES[p.plan]
    pays = []
    clock = logs.Clock(rng)
    for _ in range(max(2, n // 4)):
        clock.mo = clock.mo % 12 + 1
        pays.append({"date": "%d-%02d-%02d" % (clock.y, clock.mo, 3), "amount": price, "currency": "USD", "status": "paid", "plan": p.plan})
    F["d0"] = pays[-1]["date"]
    if cause["keys"][0] == "duplicate":
        pays.append(dict(pays[-1]))
        sub = {"status": "active", "plan": p.plan, "billing": "monthly"}
    else:
        F["d1"] = pays[-1]["date"]
        F["d0"] = "%s-%02d-%02d" % (F["d1"][:4], max(1, int(F["d1"][5:7]) - 1), 20)
        sub = {"status": "cancel_pending", "cancel_requested": F["d0"], "plan": p.plan}
    return json.dumps({"customer_id": p.customer_id, "name": "%s %s" % (p.first, p.last), "subscription": sub,
                       "payments": pays, "payment_method": "card ending %04d" % rng.randrange(10000)}, ensure_ascii=False)


def tickets_json(rng, p, cause, F, n):
    clock = logs.Clock(rng)
    tickets = []
    topics = ["Wi-Fi drops in the evening", "Firmware update question", "Satellite setup", "Parental controls schedule", "Billing address change"]
    for _ in range(max(1, n // 5)):
        clock.mo = clock.mo % 12 + 1
        tickets.append({"ticket": "T-%06d" % rng.randrange(10 ** 6), "opened": "%d-%02d-%02d" % (clock.y, clock.mo, rng.randrange(1, 28)),
                        "subject": rng.choice(topics), "status": "closed"})
    d0 = "%d-%02d-%02d" % (clock.y, clock.mo, rng.randrange(1, 20))
    F["d0"] = d0
    F["d1"] = "%s%02d" % (d0[:8], int(d0[8:]) + 7)
    if cause["keys"][0] == "expired":
        ev = {"ticket": "T-%06d" % rng.randrange(10 ** 6), "opened": d0, "subject": "Data export request", "status": "link_sent",
              "link_sent_to": F["email_masked"], "link_expires": F["d1"], "downloaded": False}
    else:
        ev = {"ticket": "T-%06d" % rng.randrange(10 ** 6), "opened": d0, "subject": "Data export request", "status": "failed",
              "error": "archive too large", "history_span_days": rng.randrange(760, 1500)}
    tickets.append(ev)
    return json.dumps({"customer_id": p.customer_id, "tickets": tickets}, ensure_ascii=False, indent=1)


def email_thread(rng, p, it, cause, F, n):
    """What a customer pastes instead of a tool result: the e-mails they received."""
    mails = []
    data = json.loads(account_json(rng, p, cause, F, n) if it["key"] == "billing" else tickets_json(rng, p, cause, F, n))
    if it["key"] == "billing":
        for pay in data["payments"]:
            mails.append("From: Larkspur Billing <billing@larkspur.example>\nDate: %s\nSubject: Your receipt for %s\n\n"
                         "Hi %s,\nwe received your payment of %s USD for %s (card ending %s). Thank you for using Larkspur Shield.\n"
                         % (pay["date"], pay["plan"], p.first, pay["amount"], pay["plan"], data["payment_method"][-4:]))
        if "cancel_requested" in data["subscription"]:
            mails.insert(-1, "From: Larkspur Billing <billing@larkspur.example>\nDate: %s\nSubject: We're processing your cancellation\n\n"
                         "Hi %s,\nwe received your request to cancel %s. Status: pending.\n" % (F["d0"], p.first, p.plan))
        F["price"] = data["payments"][-1]["amount"] + " USD"
    else:
        for t in data["tickets"]:
            extra = ""
            if t["subject"] == "Data export request":
                extra = ("Your export is ready. Download link (valid until %s)." % t["link_expires"]) if "link_expires" in t else \
                        "We could not prepare your export: archive too large."
            mails.append("From: Larkspur Support <help@larkspur.example>\nDate: %s\nSubject: [%s] %s\n\nHi %s,\n%s\n"
                         % (t["opened"], t["ticket"], t["subject"], p.first, extra or "your ticket has been closed."))
    return "\n-----\n".join(reversed(mails))


def make_F(rng, p, it):
    F = dict(model=p.model, model_s=p.model.replace(" ", "").lower(), fw=p.fw, fw_new=p.fw_new, isp=p.isp,
             isp_dom=p.isp.split()[0].lower() + ".example", ssid=p.ssid, client=p.clients[0], app=APP,
             sat=rng.choice(["S1 satellite", "S2 satellite", "Beacon extender"]), company=p.company, plan=p.plan,
             price=PRICES[p.plan] + " USD", port=str(rng.choice([25565, 32400, 8443, 51820, 3389, 27015, 51821, 8080])),
             lan=lan_ip(rng), n_sites=str(rng.randrange(12, 400)), m0=mac(rng), pm0=mac(rng, private=True),
             vlan=str(rng.choice([7, 10, 35, 100])),
             email_masked=p.email[0] + "****@" + p.email.split("@")[1])
    F["port_wrong"] = str(int(F["port"]) + rng.choice([1, -1, 10]))
    for i in range(7):
        F["r%d" % i] = str(rng.randrange(3, 240) if i in (3, 4, 5) else rng.randrange(1000, 99999))
    F["lan"] = "192.168.1.%s" % F["r5"]  # the address the user names is the one the rule points at
    return F
