"""Intents about returns, refunds, warranty, billing and escalation."""

from __future__ import annotations

import datetime as dt
import random

from .convo import Convo, lookup, opening, pay_back
from .flows_orders import claim
from .pools import PHONE, fmt_date, is_plural, product_issues, sub_business_days

REASONS = ["it doesn't fit", "the colour looks different in person", "I changed my mind",
           "it's smaller than I expected", "it's heavier than I need", "I got the same thing as a gift"]


def condition_rule(kind: str, plural: bool) -> str:
    its = "their" if plural else "its"
    return {
        "apparel": "unworn and unwashed with the tags attached",
        "footwear": "unworn outdoors and in the original box",
        "gear": f"unused and in {its} original packaging",
        "electronics": f"unused and in {its} original packaging",
    }[kind]


def flow_return_request(c: Convo) -> None:
    mode = c.pick(["eligible", "eligible", "eligible", "late"])
    ago = c.rng.randint(2, 26) if mode == "eligible" else c.rng.randint(34, 75)
    o = c.new_order("delivered", delivered_ago=ago, n_items=1)
    reason = c.pick(REASONS)
    has = opening(c, [
        f"I'd like to return the {o.product} from order {o.number} - {reason}.",
        f"How do I return {o.number}? {reason[0].upper() + reason[1:]}.",
        f"I want a refund for order {o.number}, {reason}.",
        f"return request for {o.number} please, {reason}",
    ], [
        f"I want to return something, {reason}.",
        f"Can I return the {o.product}? {reason[0].upper() + reason[1:]}.",
        f"I need to send back an item - {reason}.",
        f"how do i return the {o.product}",
    ])
    lead = lookup(c, has, apologize=False, purpose="check the return window")
    if mode == "late":
        example = product_issues(o.product, o.kind)[0][0]
        c.bot(f"{lead} It was delivered on {fmt_date(o.delivered)}, and the 30-day return window closed on "
              f"{fmt_date(o.delivered + dt.timedelta(days=30))}, so I'm not able to accept a return, I'm sorry. "
              f"If something is actually wrong with it (for example, {example}), our 2-year warranty covers "
              "manufacturing defects.")
        if c.maybe(0.5):
            c.user(c.say(["Can't you make an exception?", "It's only a few days over!",
                          "That's really unhelpful.", "Please, just this once?"]))
            c.bot("I understand, and I'm sorry it's not the answer you hoped for. The 30-day window applies "
                  "to every order and I can't override it. If you'd like a person to review it, I can pass "
                  "your request to our Customer Care team.")
    else:
        res = c.call("start_return", {"order_id": o.number, "items": [o.product], "reason": reason},
                     {"return_id": c.fresh_id("RT-", 6), "label_sent_to": c.masked_email(),
                      "refund": o.price, "currency": c.currency_code(), "refund_to": o.paid_with()})
        c.bot(f"{lead} It was delivered on {fmt_date(o.delivered)}, so it's within the 30-day window, and "
              f"I've opened return {res['return_id']}: the prepaid label is on its way to {res['label_sent_to']}. "
              f"Please send {'it' if o.it == 'it' else 'them'} back {condition_rule(o.kind, is_plural(o.product))}, "
              f"from any {o.carrier} location; once it's checked in we refund {c.money(res['refund'])} to your "
              f"{res['refund_to']}.")
        if c.maybe(0.4):
            c.exchange([
                (["Is the return shipping free?", "do I have to pay for postage?", "Is the label free?"],
                 "Yes, the prepaid label is free for returns within the window."),
                (["How long until I get my money back?", "when will I see the refund?", "how long does it take?"],
                 "Returns take a few days to reach our warehouse. We refund the day they're checked in, and "
                 "banks usually need 5-7 business days to show it."),
                (["I don't have a printer.", "no printer at home", "Do I have to print the label?"],
                 f"No problem: the email has a QR code, and {o.carrier} can print the label at the drop-off."),
            ])
    if c.maybe(0.2):
        c.close()


def flow_refund_status(c: Convo) -> None:
    o = c.new_order("delivered", delivered_ago=c.rng.randint(12, 30), n_items=1)
    state = c.pick(["issued", "issued", "awaiting_return"])
    has = opening(c, [
        f"I returned the {o.product} from {o.number} and haven't had my refund yet.",
        f"Where is my refund for order {o.number}?",
        f"Sent back my return for {o.number} ages ago. Still no money.",
        f"refund status for {o.number}?",
    ], [
        "I sent a return back but haven't received my refund.",
        "where is my refund??",
        f"When will I get the money back for the {o.product} I returned?",
        "Can you check on a refund for me please?",
    ])
    if not has:
        c.ask_for_order("check the refund", apologize=False)
        c.give_order(o.number)
    if state == "issued":
        issued = sub_business_days(c.today, c.rng.randint(1, 12))
        res = c.call("check_refund", {"order_id": o.number},
                     {"status": "refunded", "amount": o.price, "currency": c.currency_code(),
                      "refunded_on": issued.isoformat(), "refund_to": o.paid_with(),
                      "reference": c.fresh_id("RF-", 8)})
        c.bot(f"We refunded {c.money(res['amount'])} to your {res['refund_to']} on {fmt_date(issued)} "
              f"(reference {res['reference']}). Banks usually take 5-7 business days to show it; if it's "
              "longer than that, your bank can trace the payment with that reference.")
    else:
        dropped = sub_business_days(c.today, c.rng.randint(1, 3))
        res = c.call("check_refund", {"order_id": o.number},
                     {"status": "return_in_transit", "dropped_off": dropped.isoformat(), "carrier": o.carrier,
                      "amount": o.price, "currency": c.currency_code()})
        c.bot(f"Your return was dropped off with {res['carrier']} on {fmt_date(dropped)} and hasn't reached our "
              f"warehouse yet. We refund {c.money(res['amount'])} the day it's checked in, and you'll get an "
              "email when that happens.")
    if c.maybe(0.35):
        c.exchange([(["Can you speed it up?", "Can't you just refund it now?", "Is there anything faster?"],
                     "I'm afraid I can't speed that step up - it's the same for every order.")])
    if c.maybe(0.2):
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
        f"{o.number}: {defect}. Covered?",
    ], [
        f"My {o.product} is faulty - {defect}. Can I get it fixed?",
        f"Is the {o.product} covered by warranty? {defect[0].upper() + defect[1:]}.",
        f"I'd like to make a warranty claim, {defect}.",
        f"warranty question: {defect}",
    ])
    if mode == "accident":
        c.bot("I'm sorry that happened. Our 2-year warranty covers manufacturing defects, but not damage from "
              "accidents or wear and tear, so I can't open a warranty claim for this.")
        if c.maybe(0.2):
            c.close()
        return
    lead = lookup(c, has, purpose="check the warranty", reply_sorry=False)
    if mode == "covered":
        res = c.call("open_claim", {"order_id": o.number, "issue": "defect", "resolution": "review"},
                     {"claim_id": c.fresh_id("WR-", 6), "photo_link_sent_to": c.masked_email(),
                      "review_days": "3-5"})
        c.bot(f"{lead} It was delivered on {fmt_date(o.delivered)}, {o.delivered.year}, so it's within the "
              f"2-year warranty, and I've opened claim {res['claim_id']}. Please upload photos of the problem with the link sent to "
              f"{res['photo_link_sent_to']}; the team reviews claims within {res['review_days']} business days "
              "and will offer a repair, a replacement or store credit.")
    else:
        c.bot(f"{lead} I'm sorry to hear that. It was delivered on {fmt_date(o.delivered)}, {o.delivered.year}, "
              "which is more than 2 years ago, so it's outside our warranty period and I can't open a claim.")
    if c.maybe(0.2):
        c.close()


def flow_double_charge(c: Convo) -> None:
    o = c.new_order("in_transit", n_items=1)
    captured = c.maybe(0.4)
    amount = c.money(o.total)
    o.extra["charges"] = [{"amount": round(o.total, 2), "state": "captured"},
                          {"amount": round(o.total, 2), "state": "captured" if captured else "pending_hold"}]
    has = opening(c, [
        f"I was charged twice for order {o.number}.",
        f"My card shows two charges of {amount} for {o.number}.",
        f"Double charge on {o.number}!!",
        f"{o.number} - you took the money twice",
    ], [
        f"I see two charges of {amount} from you on my bank statement.",
        "Why did you take the money twice?",
        "I've been charged twice for one order.",
        "There are 2 payments on my card but I only ordered once.",
    ])
    lead = lookup(c, has, purpose="check the payments")
    if not captured:
        c.bot(f"{lead} One payment of {amount} was taken for this order. The second is a temporary "
              "authorization hold that was never captured; your bank releases it automatically, usually within "
              "3-5 business days.")
        if c.maybe(0.4):
            c.exchange([(["And if it's still there next week?", "What if it doesn't disappear?",
                          "what if it stays"],
                         "If the hold still shows after 5 business days, message us with the order number and "
                         "we'll send your bank a confirmation that only one payment was taken.")])
    else:
        res = claim(c, "double_charge", "refund")
        c.bot(f"{lead} You're right - {amount} was captured twice, which is our mistake, and I've refunded the "
              f"duplicate (claim {res['claim_id']}). {pay_back(c, res['amount'], res['refund_to'])}")
    if c.maybe(0.2):
        c.close()


def typo_code(code: str, rng: random.Random) -> str:
    i = rng.randint(0, len(code) - 2)
    swapped = code[:i] + code[i + 1] + code[i] + code[i + 2:]
    return swapped if swapped != code else code[:-1]


def flow_promo_code(c: Convo) -> None:
    code, desc = c.pick(c.pools.promos)
    desc = desc.replace("$", c.cur)
    mode = c.pick(["expired", "min_spend", "typo", "valid", "after_checkout"])
    if mode == "after_checkout":
        c.user(c.say(["I forgot to use my discount code at checkout. Can you still apply it?",
                      "Can you add a promo code to an order I already placed?",
                      f"just saw the {code} code after I ordered - can I still get the discount?"]))
        c.bot("I'm sorry, discount codes can only be applied at checkout, so I can't add one to an order "
              "afterwards. If the code is still valid, you can use it on your next order.")
        if c.maybe(0.2):
            c.close()
        return
    typed = typo_code(code, c.rng) if mode == "typo" else code
    opening(c, [], [f"The code {typed} isn't working.", f"Promo code {typed} says invalid at checkout.",
                    f"I tried {typed} but it won't apply to my cart.", f"why doesn't {typed} work??",
                    f"Is {typed} still valid?"])
    if mode == "typo":
        res = c.call("check_promo_code", {"code": typed}, {"error": "unknown code", "closest": code})
        c.bot(f"I can't find a code called {typed} - did you mean {res['closest']}? Codes need to be typed "
              "exactly, without spaces.")
        c.user(c.say(["Oh you're right, it works now!", "oops. yes that worked", "Ah, typo. Thanks!"]))
        c.bot("Great, glad it's sorted!")
    elif mode == "expired":
        ended = c.today - dt.timedelta(days=c.rng.randint(2, 40))
        c.call("check_promo_code", {"code": code}, {"code": code, "valid": False, "offer": desc,
                                                     "ended": ended.isoformat()})
        c.bot(f"I've checked: {code} ({desc}) ended on {fmt_date(ended)}, so it can't be used anymore, I'm "
              "sorry. Current offers are on our Deals page.")
        if c.maybe(0.4):
            c.exchange([(["Can you give me another code then?", "Any other discount you can give me?",
                          "can u give me a different code"],
                         "I'm not able to create or hand out discount codes, sorry. Anything running now is on "
                         "the Deals page.")])
    else:
        res = c.call("check_promo_code", {"code": code},
                     {"code": code, "valid": True, "offer": desc, "min_subtotal": 75, "currency": c.currency_code(),
                      "excludes_sale_items": True})
        c.bot(f"{code} is valid and gives {desc}, but only on a subtotal of {c.cur}{res['min_subtotal']} or "
              "more before shipping, and not on items already on sale. I can't see your cart - does it meet "
              "both?")
        if mode == "min_spend":
            c.user(c.say(["Ah, I'm a bit under that.", "oh, it's less than that", "No, it's below the minimum.",
                          "nope, too low"]))
            c.bot(f"That explains it - once the full-price subtotal reaches {c.cur}{res['min_subtotal']}, the "
                  "code will apply.")
        else:
            c.user(c.say(["One item is on sale, yes.", "oh the jacket is discounted", "Yes, it's all on sale."]))
            c.bot(f"That's the reason: {code} doesn't apply to sale items. It will apply to full-price items "
                  "if they reach the minimum.")
    if c.maybe(0.2):
        c.close()


def escalate(c: Convo, summary: str, reason: str) -> dict:
    return c.call("escalate_to_human", {"summary": summary, "reason": reason},
                  {"case_id": c.fresh_id("CS-", 6), "team": "Customer Care", "reply_within": "1 business day"})


def flow_escalation_human(c: Convo) -> None:
    opening(c, [], ["Can I speak to a human please?", "I want to talk to a real person.", "agent",
                    "Is there a person I can talk to? Not a bot.", "Please transfer me to a human.",
                    "real person please"])
    c.bot("Of course. So the team can help straight away, could you tell me briefly what it's about, and the "
          "order number if there is one?")
    if c.maybe(0.6):
        o = c.new_order("delivered", delivered_ago=c.rng.randint(1, 20))
        topic = c.pick([f"a problem with my {o.product}", "an issue with my refund", "a delivery complaint"])
        c.user(c.say([f"It's about {topic}, order {o.number}.", f"{o.number}, {topic}",
                      f"Order {o.number}. It's {topic} and I'd rather explain to a person."]))
        res = escalate(c, f"Customer asks for a person about {topic}, order {o.number}.", "customer request")
    else:
        c.user(c.say(["I just want a person.", "I'd rather not explain it to a bot.", "No, just a human."]))
        res = escalate(c, "Customer asks for a person; did not give details.", "customer request")
    c.bot(f"I've passed this to our {res['team']} team (case {res['case_id']}). Someone will reply by email "
          f"within {res['reply_within']}, or you can call {PHONE}, Monday to Friday, 8am-6pm ET.")
    if c.maybe(0.2):
        c.close()


def flow_escalation_legal(c: Convo) -> None:
    c.tone = "angry"
    o = c.new_order("delivered", delivered_ago=c.rng.randint(15, 60), n_items=1)
    threat = c.pick(["I'm contacting my lawyer", "I'll see you in small claims court",
                     "I'm reporting you to consumer protection", "I'll sue"])
    problem = c.pick(["I still haven't got my refund", "you sent me a broken item and ignored me",
                      "you charged me for something I never received"])
    has = opening(c, [
        f"{problem[0].upper() + problem[1:]} for order {o.number}. {threat}.",
        f"This is unacceptable. Order {o.number}: {problem}. {threat} if this isn't fixed today.",
        f"Order {o.number}. {threat}. {problem[0].upper() + problem[1:]}.",
    ], [
        f"{problem[0].upper() + problem[1:]}. {threat}.",
        f"Fix this now or {threat.lower()}. {problem[0].upper() + problem[1:]}.",
        f"{threat}. {problem[0].upper() + problem[1:]}.",
    ])
    sorry = c.pick(["I'm sorry this has reached this point, and I understand you're frustrated.",
                    "I understand you're frustrated, and I'm sorry it has come to this."])
    if not has:
        c.bot(f"{sorry} I'm not able to comment on legal matters, but I'll escalate this to the team that "
              "handles formal complaints. Could you give me your order number?")
        c.give_order(o.number)
        sorry = "Thank you."
    res = escalate(c, f"Formal complaint about order {o.number}: {problem}.", "legal")
    c.bot(f"{sorry} I can't comment on legal matters, but I've escalated order {o.number} to our {res['team']} "
          f"team (case {res['case_id']}). They'll contact you by email within {res['reply_within']}.")
    if c.maybe(0.4):
        c.user(c.say(["Why can't you just fix it yourself?", "One day?! I want it fixed now.",
                      "So you're just passing the buck."]))
        c.bot("I understand you want this resolved quickly. A formal complaint goes to the team that can review "
              "the whole history and make a decision - I don't want to give you an answer I can't stand behind.")


def flow_escalation_repeated(c: Convo) -> None:
    c.tone = c.pick(["angry", "angry", "neutral"])
    o = c.new_order("delivered", delivered_ago=c.rng.randint(20, 45), n_items=1)
    nth = c.pick(["third", "fourth", "second"])
    issue = c.pick(["my missing refund", "the replacement that never came", "the wrong item I got",
                    "my return that you say you never received"])
    has = opening(c, [
        f"This is the {nth} time I'm contacting you about {issue} for order {o.number}.",
        f"I've already been told twice this would be sorted. Order {o.number}. Still nothing.",
        f"Order {o.number}: {nth} message about {issue}. Every time I'm told to wait.",
    ], [
        f"This is the {nth} time I'm contacting you about {issue}.",
        f"I've been promised twice that {issue} would be fixed and nothing has happened.",
        f"{nth} time asking about {issue}!",
    ])
    if not has:
        c.bot(f"{c.sorry()} I don't want you to have to explain everything again. Could you share the order "
              "number?")
        c.give_order(o.number)
    res = escalate(c, f"Repeated contact about {issue}, order {o.number}, still unresolved.", "repeated contact")
    c.bot(f"{c.sorry() if has else 'Thank you.'} Rather than repeat the same steps, I've escalated order "
          f"{o.number} to a senior member of our {res['team']} team as a priority (case {res['case_id']}). They'll "
          f"email you within {res['reply_within']}, and they can approve things I can't.")
    if c.maybe(0.4):
        c.exchange([
            (["Can't you do anything now?", "Why can't you fix it yourself?", "can you not just do it now"],
             "I could restart the same process, but it hasn't worked before. The senior team can see the full "
             "history and decide in one go."),
            (["And if they don't get back to me?", "What if nobody contacts me again?", "and if nobody replies?"],
             f"Then call {PHONE} and give the case number - it's flagged as a priority."),
        ])
