"""Troubleshooting content per intent: how the user opens, the evidence (log lines that a log
fetch or a paste contains), what the evidence means, and the fix (as knowledge-base steps).

Each cause is a dict: `keys` are log lines (str.format with the person `p` and random values `r`),
`why` explains them (may quote `{q0}`, `{q1}`: the stamped key lines), `steps` the fix. Openers
are split train/eval by index (i % 4 == 3 is eval-only: held-out phrasings).
"""

INTENTS = []


def intent(key, category, evidence, tool, openers, kb, causes, followups, kb_steps=None):
    """kb_steps: the article's own steps where the causes' steps are actions of the agent."""
    INTENTS.append(dict(key=key, category=category, evidence=evidence, tool=tool, openers=openers,
                        kb=kb, causes=causes, followups=followups, kb_steps=kb_steps))


intent("wifi_drops", "connectivity", "syslog", "get_device_logs", [
    "My wifi keeps dropping every evening on the {model}. {client} loses connection for a minute or two and then comes back.",
    "Internet cuts out several times a day. The lights on the {model} stay white but nothing loads.",
    "hi, since last week the connection drops randomly, mostly on {client}. {isp} says the line is fine on their side.",
    "Every few hours all devices lose internet for about 30 seconds. It's driving me mad, I work from home.",
    "Wi-Fi on {ssid} disconnects constantly. Rebooting the router helps for a day and then it starts again.",
    "Our video calls freeze and drop, the router seems to reset the wifi. What is going on?",
    "connection keeps dropping out, usually around the same time at night",
    "The {model} loses the internet connection a few times a day and I have to wait until it reconnects.",
], ("KB-2104", "Intermittent Wi-Fi or internet drops",
    "Drops have three common causes: the WAN link (modem or cable), radar detection on 5 GHz DFS channels, and clients that roam badly between bands."),
    [
    dict(keys=["netifd: Interface 'wan' has lost the connection", "kernel: [{r0}.118223] eth0: Link is Down",
               "kernel: [{r1}.402911] eth0: Link is Up - 1Gbps/Full - flow control rx/tx", "netifd: Interface 'wan' is now up"],
         why="At {t0} the router logged `{q0}`, and the next line shows the Ethernet port to the modem going down. The Wi-Fi itself stayed up; what disappears is the link between the router and the modem. That points at the cable between them or the modem rebooting.",
         steps=["Check the Ethernet cable between the modem and the router's WAN port; swap it for another one if you have one.",
                "Look at the modem's own status page or lights at the time of a drop: if the modem restarts, the fault is on the line or the modem.",
                "If the link keeps dropping with a new cable, send the log times to your internet provider."]),
    dict(keys=["hostapd: wlan1: DFS-RADAR-DETECTED freq=5500 ht_enabled=1 chan_offset=0 chan_width=3",
               "hostapd: wlan1: DFS-NEW-CHANNEL freq=5180 chan=36 sec_chan=1", "hostapd: wlan1: AP-DISABLED",
               "hostapd: wlan1: AP-ENABLED"],
         why="The key line is `{q0}`: the 5 GHz radio detected radar on a DFS channel and had to leave it. The regulations make it stop transmitting (`AP-DISABLED`) and wait before coming back on a new channel, which is the minute-long drop your devices see.",
         steps=["In the {app} app open Wi-Fi > Advanced > 5 GHz channel.", "Choose a non-DFS channel: 36, 40, 44 or 48 (or 149-161 where allowed).",
                "Save; the 5 GHz network restarts once (about 20 seconds).", "Watch for a few days whether the drops stop."]),
    dict(keys=["hostapd: wlan0: STA {m0} IEEE 802.11: deauthenticated due to local deauth request",
               "steering[{r2}]: client {m0} rssi -79 dBm on 5GHz, steering to 2.4GHz", "hostapd: wlan0: STA {m0} IEEE 802.11: associated (aid 7)",
               "steering[{r2}]: client {m0} rejected BTM request (status 7)"],
         why="The router logged `{q1}` and then `{q3}`: band steering tries to move that device between 2.4 and 5 GHz, the device refuses, and it is disconnected in between. It is one device being pushed back and forth, not the internet line.",
         steps=["In the {app} app open Wi-Fi > Advanced and switch Band steering off.", "Alternatively, keep steering on and exclude the device: Devices > (device) > Wi-Fi > Pin to band.",
                "Reconnect the device once after the change."]),
], [
    ("ok I did that, do I need to restart anything?", "No full restart is needed: the change applies when you save it. If a device still shows the old behaviour, turn its Wi-Fi off and on once."),
    ("how long before I know if it worked?", "Give it two or three days of normal use, since the drops you described come and go. If it happens again, note the time and I can compare it against the log."),
])

intent("firmware_update", "firmware", "syslog", "get_device_logs", [
    "The firmware update on my {model} failed. The app says 'Update could not be installed (error 23)'.",
    "update stuck at 47% for an hour, then the router rebooted and it still shows version {fw}",
    "I tried to update to {fw_new} three times and it fails every time. What now?",
    "The {app} app keeps nagging me about a firmware update but when I press install it just fails.",
    "Firmware update failed and now the light is blinking amber. Is my router bricked??",
    "Automatic update didn't happen, manual one errors out. Router is a {model}.",
    "cant update firmware, it downloads and then says verification failed",
    "Trying to update from {fw} but the update keeps failing halfway.",
], ("KB-3310", "Firmware update fails or stops",
    "The update downloads the image, verifies its signature and checksum, writes it to the inactive flash slot and reboots into it. A failure at any step leaves the current firmware running."),
    [
    dict(keys=["fwupdate[{r2}]: downloading https://updates.larkspur.example/{model_s}/{fw_new}/image.bin",
               "fwupdate[{r2}]: download incomplete: got 18874368 of 41943040 bytes (timeout)",
               "fwupdate[{r2}]: sha256 mismatch, expected 9f2c...e41a got 01b7...7c03", "fwupdate[{r2}]: aborting, keeping slot A ({fw})"],
         why="The log shows `{q1}` followed by `{q2}`: the image was only partly downloaded, so the checksum check failed and the router kept the old firmware ({fw}). Nothing was written, so the router is not damaged; the download is the problem.",
         steps=["Make sure the router's internet connection is stable during the update (no other large downloads).",
                "Start the update again from the {app} app: Settings > Firmware > Check now.",
                "If it fails again, download the image on a computer and use Settings > Firmware > Upload file in the web interface at http://192.168.1.1."]),
    dict(keys=["fwupdate[{r2}]: image {fw_new} verified", "fwupdate[{r2}]: writing slot B",
               "fwupdate[{r2}]: ubi write error: not enough free eraseblocks (need 312, have 201)",
               "fwupdate[{r2}]: aborting, keeping slot A ({fw})"],
         why="The image downloaded and verified (`{q0}`), but writing failed: `{q2}`. The spare flash area is too small, which usually happens when the logging-to-flash option or a large USB package cache filled it.",
         steps=["In the web interface (http://192.168.1.1) open System > Storage and press Clear cached packages.",
                "Switch off System > Logging > Persistent log if it is on.", "Reboot the router, then start the update again.",
                "If the free space is still under 300 blocks, contact support for a recovery image."]),
], [
    ("the amber light: should I worry about it?", "An amber blink after a failed update means the router is running but has a pending notice; it clears after the next successful update or a reboot. Your log shows it kept the old firmware, so it is not bricked."),
    ("will I lose my settings when the update finally works?", "No, a firmware update keeps your settings. Only a factory reset erases them; if you want to be safe, export a backup first under Settings > Backup."),
])

intent("vpn_setup", "vpn", "config", "search_knowledge_base", [
    "I'm setting up a WireGuard VPN on my {model} so I can reach my NAS from outside, but the client never connects. Config below.",
    "VPN server on the router: my phone says handshake did not complete. here's my config",
    "Can you check my WireGuard config? Tunnel comes up on the laptop but no traffic goes through.",
    "trying to get the vpn server working, followed the guide but nothing. config:",
    "Our small office ({company}) wants remote access through the {model}'s VPN. The peer connects but can't reach the file server.",
    "WireGuard client shows 0 B received. Pasting the server and client config (keys are not real ones).",
    "vpn connects but then no internet at all on my phone",
    "My VPN stopped working after I changed ISP to {isp}. Config attached.",
], ("KB-4471", "Setting up the built-in WireGuard VPN server",
    "The VPN server needs a reachable WAN address and UDP port, one peer per device, and matching AllowedIPs on both sides."),
    [
    dict(keys=["Endpoint = vpn.example.net:{port_wrong}"],
         why="In the client config the line `{q0}` uses port {port_wrong}, but the server section says `ListenPort = {port}`. The client is knocking on a port nobody listens on, so the handshake never completes.",
         steps=["Open the client config and set Endpoint to your address with port {port}.", "Reconnect the tunnel on the client.",
                "In the {app} app, VPN > Peers should show a latest handshake within a few seconds."]),
    dict(keys=["AllowedIPs = 10.8.0.2/32"],
         why="The client's peer section has `{q0}`, which routes only the VPN server's tunnel address through the tunnel. Your home network (192.168.1.0/24) is not in it, so the client never sends that traffic into the tunnel.",
         steps=["In the client's [Peer] section set AllowedIPs = 10.8.0.0/24, 192.168.1.0/24 (add 0.0.0.0/0 only if you want all traffic through home).",
                "Save and reconnect the tunnel.", "Test by opening http://192.168.1.1 from the client while on mobile data."]),
    dict(keys=["WAN address: 10.{r3}.{r4}.2 (private)"],
         why="The router status you pasted shows `{q0}`: the router's WAN side has a private address, so it sits behind another router or carrier-grade NAT at your provider. Incoming VPN connections cannot reach it until that is solved.",
         steps=["Ask your provider for a public IPv4 address, or put their modem into bridge mode.",
                "If the modem has its own router, forward UDP port {port} on it to the {model}'s WAN address.",
                "Reconnect the VPN client from outside your home network."]),
], [
    ("do I need to generate new keys after changing this?", "No, the keys are fine as they are; only the line I pointed out needs to change. Keep each private key on its own device and never paste it anywhere, including here."),
    ("and if I want to add my partner's phone as well?", "Add a second peer in VPN > Peers > Add; it gets its own key pair and the next tunnel address (10.8.0.3). Each device needs its own peer; sharing one config between two devices makes them knock each other off."),
])

intent("port_forwarding", "configuration", "config", "search_knowledge_base", [
    "Port forwarding doesn't work. I forwarded port {port} to my game server but friends can't connect.",
    "I set up a port forward for my security cameras (NVR on {lan}) and it still isn't reachable from outside.",
    "Need to open a port for my Minecraft server, I did it in the app but port checkers say closed. config export below",
    "port forward not working on {model} pls help",
    "Our office needs the accounting server reachable on port {port} from the branch. Rule is set but the connection times out.",
    "My Plex server is not reachable remotely even though I added the rule. Here's the export.",
    "opened the port, still closed according to every online checker",
    "Forwarding rules seem to be ignored. I've attached my config export.",
], ("KB-1788", "Port forwarding checklist",
    "A forward works only if the router has the public address, the rule points at the right internal address and port, and the device itself accepts the connection."),
    [
    dict(keys=["rule.0 = name=server proto=tcp ext={port} int={port} to=192.168.1.{r5}"],
         why="The rule `{q0}` forwards to 192.168.1.{r5}, but in the DHCP reservations of the same export the server has a different address. Since the address changed, the router forwards to a device that isn't there.",
         steps=["Give the server a DHCP reservation (Devices > (device) > Reserve IP) so its address never changes.",
                "Edit the forwarding rule so that it points at the reserved address.", "Test from outside your network (mobile data), not from inside."]),
    dict(keys=["proto = pppoe-passthrough", "wan_ip = 10.{r3}.{r4}.17"],
         why="The export shows `{q1}`: the router's own WAN address is private, so there is another router (or carrier NAT) in front of it. Forwarding on the {model} alone cannot make the port reachable.",
         steps=["Put your provider's modem into bridge mode, or forward the same port on the modem to the {model}.",
                "Check that the WAN address in the {app} app is then a public one.", "Test again from outside your network."]),
    dict(keys=["rule.0 = name=server proto=udp ext={port} int={port} to=192.168.1.{r5}"],
         why="The rule `{q0}` forwards UDP only. The service you describe uses TCP, so the incoming TCP connections are dropped.",
         steps=["Edit the rule and set the protocol to TCP (or TCP+UDP if you are unsure).", "Save; the firewall reloads within a few seconds.",
                "Test from outside your network."]),
], [
    ("is it safe to open ports like this?", "Each forward exposes that one service to the internet, so keep the device behind it updated and use a strong password on it. Forward only the ports you need; don't use the DMZ option as a shortcut."),
    ("do I need to reboot?", "No, the rule is active as soon as you save it. Testing from a phone on mobile data shows whether it works from outside."),
])

intent("slow_speeds", "performance", "speedtest", "get_device_logs", [
    "I pay {isp} for 500 Mbps and I'm getting 80-90 on wifi. Speed test log below.",
    "speeds are terrible since I got the {model}, old router was faster",
    "Downloads are really slow in the evening. I ran tests all week, pasting the results.",
    "Why is my upload so much lower than advertised? Tests attached.",
    "The internet is slow on every device, even wired. Is the router the bottleneck?",
    "Streaming buffers constantly in the living room. Here are my speed tests.",
    "slow slow slow. 1gig plan and i get 94 mbps max on the pc with a cable",
    "Speed drops a lot in the office at the back of the house. I logged tests for a few days.",
], ("KB-2290", "Slower speeds than your plan",
    "Compare a wired test at the router with Wi-Fi tests elsewhere: a wired shortfall points at the line or the WAN link, a Wi-Fi-only shortfall at signal and band."),
    [
    dict(keys=["kernel: [{r0}.551200] eth0: Link is Up - 100Mbps/Full - flow control off"],
         why="Your wired results stop at about 94 Mbps, and the log has `{q0}`: the WAN port negotiated only 100 Mbps. That caps every device. A 100 Mbps link almost always means a damaged cable or one with only four wires.",
         steps=["Replace the cable between the modem and the router with a Cat5e or Cat6 cable.", "Check that the link comes up at 1 Gbps: Status > WAN in the {app} app.",
                "Run a wired speed test again."]),
    dict(keys=["steering[{r2}]: client {m0} rssi -81 dBm on 2.4GHz, 5GHz not visible"],
         why="The slow tests are the ones on 2.4GHz, and the router logged `{q0}`: where that device is, the 5 GHz signal does not reach. On 2.4 GHz at that signal level, 60-90 Mbps is what to expect.",
         steps=["Move the router higher and more central, away from metal and aquariums, or add a satellite between the router and that room.",
                "In the {app} app, Devices > (device) shows the signal level; aim for better than -67 dBm.", "Run the same test again from the same spot."]),
], [
    ("would a satellite help?", "For the room you describe, yes: a satellite halfway between the router and that room gives the device a strong 5 GHz signal. Place it where it still has a good signal from the main router (the app shows this during setup)."),
    ("thanks, I'll try the cable first", "Good plan, it is the cheapest fix. After swapping it, the WAN status should show 1 Gbps; if it still shows 100 Mbps, try another port on the modem."),
])

intent("parental_controls", "family", "json", "get_device_logs", [
    "Parental controls schedule isn't working. My son's phone still has internet after 10pm.",
    "I set bedtime for the kids' tablets but they can still get online. App events below.",
    "The content filter on the {model} lets YouTube through even though I blocked it.",
    "pause internet button doesn't pause anything??",
    "My daughter's laptop ignores the schedule in the Family profile.",
    "Family profiles stopped working after the kids got new phones.",
    "time limits not applied to the switch, kids play all night",
    "I can't figure out why the bedtime rule doesn't apply to one device.",
], ("KB-5012", "Family profiles and schedules",
    "A profile applies to devices by their hardware (MAC) address. Phones and tablets that use a private, changing Wi-Fi address appear as new devices that no profile covers."),
    [
    dict(keys=[{"event": "device_new", "mac": "{pm0}", "name": "{client}", "private_mac": True},
               {"event": "profile_skip", "mac": "{pm0}", "reason": "device not in any profile"}],
         why="The events show `device_new` for {client} with a private (randomised) MAC address, followed by `profile_skip` with reason \"device not in any profile\". The device came back with a new address, so to the router it is a different device.",
         steps=["On the device, turn off Private Wi-Fi Address (iOS) or set MAC randomisation to 'Use device MAC' (Android) for your network only.",
                "In the {app} app, open Family > (profile) > Devices and add the device again.", "Check the next scheduled pause in Family > (profile) > Schedule."]),
    dict(keys=[{"event": "schedule_eval", "profile": "Kids", "tz": "UTC", "local_tz_setting": "missing"},
               {"event": "schedule_skip", "profile": "Kids", "reason": "window not active"}],
         why="The events show `schedule_eval` with `\"tz\": \"UTC\"` and the local time zone setting missing, then `schedule_skip` (\"window not active\"). The schedule is being checked in UTC instead of your local time, so bedtime starts hours off.",
         steps=["In the {app} app open Settings > Time zone and set your local time zone.", "Open Family > Kids > Schedule and save it once more.",
                "Use Pause now to check the profile applies while you wait for the next scheduled window."]),
], [
    ("can the kids turn the private address back on themselves?", "On most phones, yes, the setting is per network in the Wi-Fi settings. If it comes back, the device shows up as new in the app; you can turn on 'Notify me about new devices' to notice."),
    ("ok it works now, thank you!!", "Glad it works. The schedule now applies every night without you doing anything."),
])

intent("api_errors", "developer", "trace", "search_knowledge_base", [
    "We manage about {n_sites} customer sites through the Larkspur Cloud API. Since this morning our nightly sync fails. Trace below.",
    "API returns errors for our MSP dashboard, started today. Stack trace:",
    "getting exceptions from the larkspur cloud api in our integration, pasting the trace",
    "Our device sync job for {company} crashes every run now. Did something change on your side?",
    "Hi, developer here. Calls to /v2/sites/.../devices started failing. Trace attached.",
    "The sync script stops with this error, can you tell me what it means?",
    "integration broken since last deploy, trace below, pls advise",
    "We get this exception when pulling device status for all sites.",
], ("KB-7003", "Cloud API: authentication, rate limits and pagination",
    "API tokens last 60 minutes and are renewed with the refresh token; each account may send 10 requests per second, and list calls return at most 100 items per page."),
    [
    dict(keys=["HTTPError", "401 Client Error: Unauthorized for url: https://api.larkspur.example/v2/sites/{r6}/devices (token expired)"],
         why="The last line of your trace is `{q0}: {q1}`. The access token has expired: they last 60 minutes, and the job runs longer than that without renewing it.",
         steps=["Before each request (or on a 401), exchange the refresh token at POST /v2/oauth/token for a new access token.",
                "Retry the failed request once with the new token.", "Keep the refresh token secret; it does not need to change."]),
    dict(keys=["RateLimitError", "429 Too Many Requests: limit 10 req/s exceeded, retry after 2s"],
         why="The trace ends with `{q0}: {q1}`. The sync sends requests faster than the 10 per second an account may send, and the client gives up instead of waiting.",
         steps=["Honour the Retry-After header: wait that many seconds before retrying.", "Limit the job to at most 10 requests per second, for example with a token bucket.",
                "Use the site list's `updated_since` filter so that unchanged sites aren't fetched every night."]),
], [
    ("is there a sandbox we can test against?", "I don't have details about a sandbox in what I can see here. I can open a request with the developer-relations team so that they reply to you by e-mail."),
    ("great, that fixed it", "Great to hear. The fix should also make the job more robust if it grows to more sites."),
])

intent("mesh_satellite", "connectivity", "syslog", "get_device_logs", [
    "My {sat} keeps going offline. The app shows it red every morning.",
    "The satellite in the garage won't join the mesh anymore after a power cut.",
    "mesh node shows 'weak connection' all the time, devices near it are slow",
    "I added a second satellite and now the first one disconnects.",
    "Satellite light is blinking blue forever. Tried unplugging it twice.",
    "Upstairs {sat} is offline and {client} upstairs has no internet.",
    "mesh keeps breaking, 1 router + 2 satellites",
    "The satellite pairs fine next to the router but not where I need it.",
], ("KB-2650", "Satellite offline or weak backhaul",
    "Satellites connect to the router over a 5 GHz backhaul (or Ethernet). They need a backhaul signal better than -70 dBm to stay joined."),
    [
    dict(keys=["meshd[{r2}]: backhaul peer {m0} rssi -83 dBm rate 29 Mbps", "meshd[{r2}]: peer {m0} backhaul below threshold, leaving mesh",
               "meshd[{r2}]: peer {m0} rejoin attempt 3 failed"],
         why="The router logged `{q0}` and then `{q1}`: the satellite's link to the router is at -83 dBm, well below the -70 dBm it needs, so it drops out and fails to rejoin.",
         steps=["Move the satellite about halfway between the router and the area you want to cover.",
                "In the {app} app, Mesh > (satellite) > Placement test should show 'Good' or 'Excellent'.", "If you can, connect the satellite by Ethernet instead (wired backhaul)."]),
    dict(keys=["meshd[{r2}]: peer {m0} firmware {fw} incompatible with controller {fw_new}", "meshd[{r2}]: peer {m0} join refused"],
         why="The log says `{q0}` and then `{q1}`: the router updated to {fw_new} but the satellite still runs {fw}, and the router refuses to let it join with a different version.",
         steps=["Bring the satellite next to the router and connect it with an Ethernet cable.", "In the {app} app, Settings > Firmware > Update satellites.",
                "After the update, move the satellite back to its place."]),
], [
    ("how do I know the new spot is good?", "Run Mesh > (satellite) > Placement test in the app once it is plugged in at the new spot. 'Good' or better is fine; 'Weak' means move it closer to the router."),
    ("ok, will try tonight", "Sounds good. If the placement test still says weak, tell me which rooms are in between and I can suggest a spot."),
])

intent("isp_login", "setup", "syslog", "get_device_logs", [
    "Just set up the {model}, it says 'no internet'. My ISP is {isp} and they use PPPoE.",
    "New router, can't get online. Old one worked fine with the same modem.",
    "internet light is red after setup, isp {isp}",
    "Setup wizard finished but there's no internet connection. What did I do wrong?",
    "We moved office and the {model} can't connect with the new {isp} line.",
    "After a factory reset the router won't connect to the internet any more.",
    "router says wan connected but no internet",
    "The router can't get an internet address from the modem.",
], ("KB-1201", "No internet after setup",
    "The router needs the right connection type for your provider: DHCP (cable, most fibre), PPPoE with username and password (many DSL and fibre), or a VLAN ID on some fibre lines."),
    [
    dict(keys=["pppd[{r2}]: Connect: ppp0 <--> eth0.{vlan}", "pppd[{r2}]: PAP authentication failed", "pppd[{r2}]: Connection terminated."],
         why="The log shows `{q1}`: the modem and the provider answer, but they reject the PPPoE username or password.",
         steps=["Check the PPPoE username and password from your provider's welcome letter (they are case-sensitive; the username often contains the provider's domain).",
                "In the {app} app, Internet > Connection type > PPPoE, enter them again and save.", "If it still fails, ask your provider to reset the PPPoE password."]),
    dict(keys=["odhcpc[{r2}]: sending discover on eth0", "odhcpc[{r2}]: no lease, giving up after 30 tries"],
         why="The router keeps asking for an address (`{q0}`) and gets no answer (`{q1}`). Some fibre lines need a VLAN ID on the WAN, and without it nothing answers.",
         steps=["Look up whether your provider needs a VLAN ID (their welcome letter, or their support pages).", "In the {app} app, Internet > Advanced > VLAN ID, enter it and save.",
                "Restart the modem, then the router."]),
], [
    ("where do I find the pppoe password?", "It is in the welcome letter or e-mail from your provider, or in your account on their website. Larkspur doesn't have it; only the provider does."),
    ("It works!", "Great, you're online. The router now remembers the settings, including after a restart."),
])

intent("billing", "billing", "account", "get_account", [
    "I was charged twice for {plan} this month. Can you look into it?",
    "Why did my {plan} subscription go up? I never agreed to a price change. Email thread below.",
    "I cancelled Larkspur Shield but I'm still being charged.",
    "Need a refund, I was billed for the yearly plan but I chose monthly.",
    "hey theres a charge from larkspur i dont recognise",
    "Our company ({company}) needs invoices with our VAT number, the ones we get don't have it.",
    "charged again after cancel?? not happy",
    "Please explain the two charges on my card from Larkspur Networks.",
], ("KB-9020", "Billing questions for Larkspur Shield",
    "Shield is billed in advance per month or year. Refunds for duplicate charges go back to the original card in 5-10 business days."),
    [
    dict(keys=["duplicate"],
         why="Your account shows two payments for {plan} on {d0}, each {price}, for the same billing period. That is a duplicate charge.",
         steps=["I've requested a refund of the second payment ({price}) to the card it came from.", "It shows on your statement within 5-10 business days.",
                "You'll get a confirmation e-mail with the refund reference."]),
    dict(keys=["after_cancel"],
         why="Your account shows the cancellation was requested on {d0}, and the next charge ran on {d1}. The cancellation was recorded as 'pending' and never completed, so the renewal went through.",
         steps=["I've completed the cancellation; the status is now 'cancelled'.", "I've requested a refund of the charge on {d1} ({price}).",
                "The refund reaches your card within 5-10 business days."]),
], [
    ("will this happen again next month?", "No: with the subscription cancelled there is no next renewal, and the duplicate refund doesn't change your billing date."),
    ("can I get that in writing?", "Yes, the confirmation e-mail goes to the address on your account. You can also see the refund under Account > Billing in the {app} app."),
], kb_steps=["Open Account > Billing in the {app} app to see every payment and the period it covers.",
             "A duplicate payment for the same period is refunded to the original card within 5-10 business days.",
             "A cancellation takes effect at the end of the paid period and shows as 'cancelled' under Account > Billing once completed.",
             "For invoices with a VAT number, add it under Account > Billing > Company details; it appears on invoices issued after that."])

intent("data_export", "account", "tickets", "get_ticket_history", [
    "I'd like a copy of all the data you hold on me and my network. How do I export it?",
    "How do I export my usage history from the {app} app? The export button gives an error.",
    "I requested my data export two weeks ago and never got anything.",
    "need to download traffic history for all devices as csv for our IT audit ({company})",
    "data export link expired before I could open it",
    "I want my account data before I close my account.",
    "where is my data export? asked twice already",
    "Can I get the device history exported in a format Excel can open?",
], ("KB-8105", "Exporting your data",
    "Exports are prepared in the background and sent as a download link valid for 7 days. Usage history can be exported as CSV; the full account export is a ZIP with JSON files."),
    [
    dict(keys=["expired"],
         why="Your ticket history shows the export was prepared on {d0} and the link was sent to {email_masked}; it was valid for 7 days and expired on {d1} without being downloaded.",
         steps=["I've started a new export; it usually takes up to 24 hours.", "The link goes to {email_masked} and is valid for 7 days.",
                "Check the spam folder if it doesn't arrive."]),
    dict(keys=["failed"],
         why="Your ticket history shows the export request on {d0} failed with 'archive too large', because the usage history covers more than two years.",
         steps=["In the {app} app, Account > Export, choose a date range of one year or less per export.", "Request one export per year you need.",
                "Each link arrives by e-mail and stays valid for 7 days."]),
], [
    ("what format will it be in?", "Usage history comes as CSV, which Excel and other spreadsheet programs open directly; the full account export is a ZIP file with JSON files."),
    ("thanks, got it now", "Great. The link stays valid for 7 days in case you need to download it again."),
], kb_steps=["In the {app} app open Account > Export and choose Usage history (CSV) or Full account export (ZIP).",
             "The export is prepared within 24 hours and the download link is sent by e-mail.", "The link is valid for 7 days.",
             "Exports covering more than two years may fail; request one year at a time."])
