"""Clearly fake but realistic-looking logs, configs, stack traces and knowledge-base articles."""

import json

from .pools import lan_ip, mac

MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]


class Clock:
    """A wall clock that moves forward by random steps (seconds)."""

    def __init__(self, rng, year=None):
        self.rng = rng
        self.y = year or rng.choice([2025, 2026])
        self.mo = rng.randrange(1, 13)
        self.d = rng.randrange(1, 28)
        self.t = rng.randrange(0, 20 * 3600)

    def tick(self, lo=1, hi=240):
        self.t += self.rng.randrange(lo, hi)
        if self.t >= 86400:
            self.t -= 86400
            self.d = self.d % 28 + 1

    def hms(self):
        return "%02d:%02d:%02d" % (self.t // 3600, self.t // 60 % 60, self.t % 60)

    def iso(self):
        return "%d-%02d-%02dT%s+00:00" % (self.y, self.mo, self.d, self.hms())

    def date(self):
        return "%d-%02d-%02d" % (self.y, self.mo, self.d)

    def syslog(self):
        return "%s %2d %s" % (MONTHS[self.mo - 1], self.d, self.hms())


def filler_line(rng, p, clock):
    c = rng.choice(p.clients)
    ip = lan_ip(rng)
    m = mac(rng)
    choices = [
        "dnsmasq-dhcp[%d]: DHCPREQUEST(br-lan) %s %s" % (rng.randrange(900, 2000), ip, m),
        "dnsmasq-dhcp[%d]: DHCPACK(br-lan) %s %s %s" % (rng.randrange(900, 2000), ip, m, c),
        "hostapd: wlan%d: STA %s IEEE 802.11: associated (aid %d)" % (rng.randrange(2), m, rng.randrange(1, 30)),
        "hostapd: wlan%d: STA %s WPA: pairwise key handshake completed (RSN)" % (rng.randrange(2), m),
        "hostapd: wlan%d: STA %s IEEE 802.11: disassociated due to inactivity" % (rng.randrange(2), m),
        "meshd[%d]: backhaul peer %s rssi -%d dBm rate %d Mbps" % (rng.randrange(300, 600), mac(rng), rng.randrange(48, 70), rng.choice([433, 866, 1201, 2402])),
        "ntpd[%d]: adjusting local clock by %0.6fs" % (rng.randrange(200, 900), rng.random() / 10),
        "kernel: [%d.%06d] br-lan: port %d(eth%d) entered forwarding state" % (rng.randrange(100, 99999), rng.randrange(10 ** 6), rng.randrange(1, 5), rng.randrange(1, 4)),
        "cloudlink[%d]: heartbeat ok rtt=%dms" % (rng.randrange(1000, 3000), rng.randrange(18, 90)),
        "odhcp6c[%d]: Got a valid reply after %dms" % (rng.randrange(700, 999), rng.randrange(5, 400)),
        "firewall: Reloading firewall due to ifupdate of wan (eth0)",
        "larkspur-stats[%d]: uploaded %d samples" % (rng.randrange(2000, 4000), rng.randrange(10, 300)),
        "dropbear[%d]: Exit before auth from <%s:%d>: Exited normally" % (rng.randrange(3000, 9000), ip, rng.randrange(40000, 65000)),
    ]
    clock.tick()
    return "%s %s %s" % (clock.syslog(), p.hostname, rng.choice(choices))


def syslog(rng, p, n, key_lines, clock=None):
    """n filler lines with the key lines (already formatted, no timestamp) spread through them.
    Returns (text, stamped key lines) so an assistant can quote them."""
    clock = clock or Clock(rng)
    n = max(n, len(key_lines) + 1)
    slots = sorted(rng.sample(range(1, n + 1), len(key_lines)))
    lines, quoted, k = [], [], 0
    for i in range(n + 1):
        if k < len(key_lines) and i == slots[k]:
            clock.tick(1, 30)
            line = "%s %s %s" % (clock.syslog(), p.hostname, key_lines[k])
            lines.append(line)
            quoted.append(line)
            k += 1
        else:
            lines.append(filler_line(rng, p, clock))
    return "\n".join(lines), quoted


def json_events(rng, p, n, key_events):
    """App/cloud events as JSON lines; key_events are dicts merged in at random places."""
    clock = Clock(rng)
    kinds = ["app_open", "token_refresh", "device_status", "push_delivered", "speedtest_view", "settings_read"]
    out, quoted = [], []
    slots = set(rng.sample(range(n + len(key_events)), len(key_events)))
    keys = list(key_events)
    for i in range(n + len(key_events)):
        clock.tick(1, 90)
        if i in slots:
            ev = dict({"ts": clock.iso()}, **keys.pop(0))
            quoted.append(ev)
        else:
            ev = {"ts": clock.iso(), "event": rng.choice(kinds), "app": "%s.%d" % (rng.choice(["5.2", "5.3", "6.0"]), rng.randrange(10)),
                  "latency_ms": rng.randrange(30, 900)}
        out.append(json.dumps(ev, ensure_ascii=False))
    return "\n".join(out), quoted


def stack_trace(rng, lang, exc, msg, depth):
    if lang == "python":
        files = ["sync_devices.py", "larkspur_client/api.py", "larkspur_client/http.py", "jobs/nightly.py", "lib/retry.py"]
        fns = ["run", "fetch_all", "_request", "get_devices", "call", "wrapper", "main", "sync_site"]
        lines = ["Traceback (most recent call last):"]
        for i in range(depth):
            f = rng.choice(files)
            lines.append('  File "/opt/msp-tools/%s", line %d, in %s' % (f, rng.randrange(12, 480), rng.choice(fns)))
            lines.append("    resp = self.session.request(method, url, **kw)" if i % 2 else "    return fn(*args, **kwargs)")
        lines.append("%s: %s" % (exc, msg))
        return "\n".join(lines)
    cls = ["com.example.msp.sync.DeviceSync", "com.example.msp.api.LarkspurClient", "okhttp3.RealCall",
           "com.example.msp.util.Retry", "java.util.concurrent.FutureTask"]
    lines = ["Exception in thread \"sync-%d\" %s: %s" % (rng.randrange(1, 9), exc, msg)]
    for _ in range(depth):
        c = rng.choice(cls)
        lines.append("\tat %s.%s(%s.java:%d)" % (c, rng.choice(["run", "execute", "get", "call", "fetch"]), c.rsplit(".", 1)[1], rng.randrange(20, 400)))
    return "\n".join(lines)


def speedtests(rng, n, down_range, up_range):
    rows = ["date,time,server,ping_ms,down_mbps,up_mbps,client,band"]
    clock = Clock(rng)
    for _ in range(n):
        clock.tick(600, 7200)
        rows.append("%s,%s,%s,%d,%.1f,%.1f,%s,%s" % (
            clock.date(), clock.hms()[:5], rng.choice(["Springfield", "Lakeside", "Metro-2"]), rng.randrange(6, 60),
            rng.uniform(*down_range), rng.uniform(*up_range), rng.choice(["laptop", "phone", "desktop(wired)"]),
            rng.choice(["5GHz", "2.4GHz", "wired"])))
    return "\n".join(rows)


def fake_key(rng):
    return "EXAMPLE" + "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789") for _ in range(36)) + "="


def config_export(rng, p, extra_sections, size=0):
    """A router configuration export (INI-like), with the sections that matter given as text."""
    sec = ["# Larkspur %s configuration export, firmware %s, serial %s" % (p.model, p.fw, p.serial),
           "[system]", "hostname = %s" % p.hostname, "timezone = UTC", "led_mode = %s" % rng.choice(["on", "night", "off"]),
           "", "[wan]", "proto = %s" % rng.choice(["dhcp", "pppoe", "static"]), "mtu = %d" % rng.choice([1500, 1492, 1480]),
           "", "[wifi]", "ssid = %s" % p.ssid, "band_steering = %s" % rng.choice(["on", "off"]),
           "channel_5g = %s" % rng.choice(["auto", "36", "44", "149"]), "channel_2g = %s" % rng.choice(["auto", "1", "6", "11"]),
           "security = %s" % rng.choice(["wpa2-psk", "wpa3-sae", "wpa2/wpa3"]), "passphrase = ********", ""]
    n_res = rng.randrange(1, 4) + size // 3
    sec.append("[dhcp]")
    sec.append("range = 192.168.1.100-192.168.1.199")
    for i in range(n_res):
        sec.append("reservation.%d = %s %s %s" % (i, mac(rng), "192.168.1.%d" % (10 + i), rng.choice(p.clients)))
    sec.append("")
    return "\n".join(sec + extra_sections)


def kb_article(rng, kb_id, title, intro, steps, notes):
    body = ["%s: %s" % (kb_id, title), "", intro, "", "Steps:"]
    body += ["%d. %s" % (i + 1, s) for i, s in enumerate(steps)]
    if notes:
        body += ["", "Notes:"] + ["- %s" % n for n in notes]
    return "\n".join(body)
