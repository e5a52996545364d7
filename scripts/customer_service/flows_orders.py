"""Intents about orders and deliveries. Each flow writes one conversation into `c`; whatever the
assistant says about an order comes from a tool result earlier in the conversation."""

from __future__ import annotations

import datetime as dt

from .convo import Convo, lookup, opening, pay_back
from .pools import RELATIONS, article, fmt_date, fmt_day, product_issues

SCANS = ["In transit", "Arrived at sort facility", "Departed distribution center",
         "Processed at regional hub", "Held at depot"]


def ships(o) -> str:
    return "ship" if o.it == "they" else "ships"


def claim(c: Convo, issue: str, resolution: str, amount: float | None = None, label: bool = False) -> dict:
    """open_claim on the conversation's order, and what the backend answers."""
    o = c.order
    res = {"claim_id": c.fresh_id("CS-", 6), "resolution": resolution}
    if resolution == "refund":
        res.update(amount=round(amount if amount is not None else o.total, 2), currency=c.currency_code(),
                   refund_to=o.paid_with())
    elif resolution == "replacement":
        res.update(item=f"{o.product} ({o.variant})", ships_in="1-2 business days")
    if label:
        res["return_label_sent_to"] = c.masked_email()
    return c.call("open_claim", {"order_id": o.number, "issue": issue, "resolution": resolution}, res)


def flow_order_status(c: Convo) -> None:
    status = c.pick(["processing", "in_transit", "in_transit", "out_for_delivery", "delivered"])
    o = c.new_order(status, delivered_ago=c.rng.randint(0, 2))
    p, rel = o.product, c.pick(RELATIONS)
    has = opening(c, [
        f"Where is my order {o.number}?",
        f"Can you check the status of order {o.number} please?",
        f"my order {o.number} hasn't arrived yet",
        f"any update on {o.number}",
        f"I ordered {article(p)} as a present for my {rel}. Order number {o.number}. When will it arrive?",
        f"Status of {o.number}?",
        f"has {o.number} shipped yet?",
        f"Could you tell me when {o.number} will be delivered?",
    ], [
        "Can you tell me where my order is?",
        f"I ordered {article(p)} recently. Any idea when it will arrive?",
        "my order hasn't arrived yet, can you check?",
        "where's my stuff",
        f"I bought the {p} as a gift for my {rel} - can you check when it will get here?",
        "When will my order arrive?",
        "Is my package on its way?",
        "Has my order shipped yet?",
    ])
    lead = lookup(c, has, apologize=False, purpose="check on it")
    if status == "processing":
        text = ("It's still being packed at our warehouse. Orders usually ship within 1-2 business days, "
                "and you'll get an email with the tracking number as soon as it ships.")
    elif status == "in_transit":
        text = (f"It shipped on {fmt_date(o.shipped)} with {o.carrier}, tracking number {o.tracking}, and "
                f"the carrier expects to deliver it by {fmt_day(o.eta)}.")
    elif status == "out_for_delivery":
        text = (f"Good news: it's out for delivery with {o.carrier} (tracking {o.tracking}), so it should "
                "reach you by the end of the day.")
    else:
        text = (f"It shows as delivered by {o.carrier} on {fmt_day(o.delivered)}. If you can't find it, "
                "check with neighbours or a parcel room first - if it's not there, tell me and I'll open a claim.")
    c.bot(f"{lead} {text}")
    if status in ("in_transit", "out_for_delivery") and c.maybe(0.35):
        c.exchange([
            (["What time will it come?", "Do you know roughly what time they'll deliver?", "what time window",
              "Can you tell me the delivery time?"],
             f"I don't have a delivery time window, I'm afraid. {o.carrier} usually shows one on the "
             f"tracking page on the day of delivery."),
            (["Can you send it to my work address instead?", "can it go to my office", "Can I redirect it?"],
             "Once a parcel is with the carrier we can't change the address from our side. You may be able "
             f"to request a redirect on {o.carrier}'s tracking page."),
        ])
    elif status == "processing" and c.maybe(0.3):
        c.exchange([(["Can I still add something to it?", "Could I add another item to that order?",
                      "can I add one more thing"],
                     "I'm not able to add items to an existing order. You could place a separate order, or, "
                     "since this one hasn't shipped, I can cancel it so you can reorder everything together.")])
    if c.maybe(0.2):
        c.close()


def flow_late_delivery(c: Convo) -> None:
    o = c.new_order("late")
    stuck = c.maybe(0.5)
    days = c.rng.randint(7, 10) if stuck else c.rng.randint(2, 4)
    last_scan = c.today - dt.timedelta(days=days)
    has = opening(c, [
        f"My order {o.number} was supposed to arrive on {fmt_date(o.eta)} and it still isn't here.",
        f"{o.number} is late. Tracking hasn't moved in days.",
        f"It's been two weeks since I ordered ({o.number}) and nothing has arrived.",
        f"order {o.number} is overdue, what's going on?",
    ], [
        "My package is late.",
        "my order still hasn't arrived and it's past the delivery date",
        "I've been waiting forever for my delivery, what is going on?",
        "Where is my parcel? The estimated date was days ago.",
    ])
    lead = lookup(c, has)
    c.call("track_parcel", {"tracking_number": o.tracking},
           {"carrier": o.carrier, "last_scan": last_scan.isoformat(), "event": c.pick(SCANS),
            "days_without_update": days})
    if stuck:
        c.bot(f"{lead} The estimate was {fmt_date(o.eta)}, and {o.carrier} last scanned it on "
              f"{fmt_date(last_scan)} - no movement for {days} days. A parcel with no update for 7 days counts "
              f"as lost, so I can send a replacement at no cost or refund {c.money(o.total)}. Which would you "
              "prefer?")
        lost_parcel_choice(c)
    else:
        c.bot(f"{lead} It's running late: the estimate was {fmt_date(o.eta)}, and {o.carrier} last scanned it "
              f"on {fmt_date(last_scan)}, so it's still moving. Please give it a few more days; if there's no "
              "new scan for 7 days, message us and we'll send a replacement or a refund.")
        if c.maybe(0.4):
            c.exchange([
                (["I need it by Saturday, can you guarantee that?", "Will it definitely come this week?",
                  "can you promise it'll be here by friday?"],
                 f"I'm sorry, I can't promise a delivery date that {o.carrier} hasn't given us, and I'd rather "
                 "not guess."),
                (["Can't you just send another one now?", "Why not send a replacement today?",
                  "just send me a new one"],
                 "While the parcel is still moving, we wait before sending a second one, because the first "
                 "usually turns up. After 7 days without a scan, we'll replace or refund it, your choice."),
            ])
    if c.maybe(0.2):
        c.close()


def lost_parcel_choice(c: Convo, choice: str = "", ask: bool = True) -> None:
    o = c.order
    choice = choice or c.pick(["replacement", "refund"])
    if choice == "replacement":
        if ask:
            c.user(c.say(["Replacement please.", "A replacement, I still need it.", "Can you reship it?",
                          "send a new one pls", "Replace it please."]))
        res = claim(c, "lost", "replacement")
        c.bot(f"Done - claim {res['claim_id']}: a new {res['item']} {ships(o)} within {res['ships_in']}, and you'll "
              "get the tracking number by email.")
    else:
        if ask:
            c.user(c.say(["Just refund me.", "Refund please.", "I'd rather have my money back.",
                          "refund. I'm done waiting."]))
        res = claim(c, "lost", "refund")
        c.bot(f"Done - claim {res['claim_id']}. {pay_back(c, res['amount'], res['refund_to'])}")


def flow_lost_package(c: Convo) -> None:
    o = c.new_order("delivered", delivered_ago=c.rng.randint(2, 5))
    has = opening(c, [
        f"Tracking for {o.number} says delivered but there's nothing here.",
        f"It says my parcel was delivered but I never got it. Order {o.number}.",
        f"Order {o.number} shows as delivered. It wasn't. Where is it?",
        f"{o.number} marked delivered, not received",
    ], [
        "My order says delivered but I didn't receive it.",
        "the tracking says delivered?? nothing at my door",
        "Parcel marked as delivered, not received. What now?",
        "I think my package was stolen, it says delivered but it's not here.",
    ])
    ask = "" if has else " Could you also send me the order number (FH- and seven digits)?"
    c.bot(f"{c.sorry()} If it's not with a neighbour or in a parcel room, I'll open a missing-parcel claim. Would "
          f"you like a replacement or a refund?{ask}".strip())
    if not has:
        choice = c.pick(["replacement", "refund"])
        c.user(c.say([f"{o.number}, and a {choice} please", f"It's {o.number}. {choice.capitalize()}.",
                       f"{choice} please - order {o.number}", f"Order {o.number}, I'd like a {choice}"]))
        lost_parcel_choice(c, choice, ask=False)
        return
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
    has = opening(c, [
        f"I ordered the {o.product} but received {wrong}. Order {o.number}.",
        f"Wrong item in my parcel for {o.number} - I got {wrong}.",
        f"You sent me {wrong}!! Order {o.number}.",
        f"My order {o.number} arrived, but inside was {wrong}.",
    ], [
        f"I received {wrong} instead of what I ordered.",
        "You sent me the wrong item.",
        f"The box came but it's {wrong}, not what I paid for.",
        "wrong item delivered, what do I do?",
    ])
    lead = lookup(c, has, reply_sorry=False)
    if c.maybe(0.85):
        res = claim(c, "wrong_item", "replacement", label=True)
        c.bot(f"{lead} I'm sorry we sent the wrong item. I've opened claim {res['claim_id']}: the correct "
              f"{o.product} ({o.variant}) {ships(o)} within {res['ships_in']} at no cost, and a prepaid return label "
              f"for the wrong one is on its way to {res['return_label_sent_to']}.")
        if c.maybe(0.4):
            c.exchange([
                (["Do I need the original packaging?", "what box do I use", "Does it need the original box?"],
                 "Any sturdy box or bag is fine. Just stick the label on the outside."),
                (["Can I just keep the wrong one?", "Do I really have to send it back?", "do i have to return it"],
                 "Please do send it back with the label - it's free, and it helps our warehouse fix the mix-up."),
            ])
    else:
        c.call("open_claim", {"order_id": o.number, "issue": "wrong_item", "resolution": "replacement"},
               {"error": "out of stock", "item": o.product, "variant": o.variant})
        c.bot(f"{lead} I'm sorry we sent the wrong item. The {o.product} in {o.variant} is out of stock, so "
              f"I can't send a replacement. I can refund {c.money(o.price)} instead - shall I?")
        c.user(c.say(["Yes, refund please.", "ok go ahead", "Yes please.", "fine, refund it"]))
        res = claim(c, "wrong_item", "refund", amount=o.price, label=True)
        c.bot(f"Done (claim {res['claim_id']}). {pay_back(c, res['amount'], res['refund_to'])} A return label "
              f"for the item is on its way to {res['return_label_sent_to']}.")
    if c.maybe(0.2):
        c.close()


def flow_damaged_item(c: Convo) -> None:
    o = c.new_order("delivered", delivered_ago=c.rng.randint(0, 6), n_items=1)
    damage = c.pick(product_issues(o.product, o.kind)[1])
    has = opening(c, [
        f"The {o.product} from order {o.number} arrived with {damage}.",
        f"Order {o.number} came damaged - {damage}.",
        f"My {o.product} ({o.number}) arrived with {damage}. Not what I expect for the price.",
        f"I just unpacked order {o.number} and it has {damage}. What are my options?",
    ], [
        f"My {o.product} arrived damaged.",
        f"I got my order today and it has {damage}.",
        "item arrived broken",
        f"the {o.product} I received has {damage}. Can I get a new one?",
    ])
    ask = "" if has else " And what's the order number (FH- and seven digits)?"
    c.bot(f"I'm sorry {o.it} arrived like that. Would you like a replacement or a full refund? Either way you "
          f"won't need to send the damaged item back.{ask}")
    num = "" if has else f" Order {o.number}."
    if c.maybe(0.55):
        c.user(c.say(["Replacement please.", "A replacement.", "new one pls", "Replacement, same size."]) + num)
        res = claim(c, "damaged", "replacement")
        c.bot(f"Done - claim {res['claim_id']}. A new {res['item']} {ships(o)} within {res['ships_in']}, and the "
              "tracking number will be emailed to you.")
    else:
        c.user(c.say(["Refund please.", "I'd prefer a refund.", "just refund it", "Money back please."]) + num)
        res = claim(c, "damaged", "refund", amount=o.price)
        c.bot(f"Done - claim {res['claim_id']}. {pay_back(c, res['amount'], res['refund_to'])}")
    if c.maybe(0.2):
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
    if not has:
        c.ask_for_order("cancel it", apologize=False)
        c.give_order(o.number)
    if shipped:
        c.call("cancel_order", {"order_id": o.number},
               {"error": "already shipped", "shipped": o.shipped.isoformat(), "carrier": o.carrier})
        c.bot(f"I'm sorry, order {o.number} already shipped on {fmt_date(o.shipped)} with {o.carrier}, so it "
              "can't be cancelled anymore. Once it arrives, you can return it within 30 days with a free "
              "prepaid label, and we'll refund you when it's back with us.")
    else:
        res = c.call("cancel_order", {"order_id": o.number},
                     {"order_id": o.number, "status": "cancelled", "refund": round(o.total, 2),
                      "currency": c.currency_code(), "refund_to": o.paid_with()})
        c.bot(f"Done - order {o.number} is cancelled and a confirmation email is on its way. "
              f"{pay_back(c, res['refund'], res['refund_to'])}")
    if c.maybe(0.2):
        c.close()


def flow_address_change(c: Convo) -> None:
    mode = c.pick(["processing", "processing", "shipped", "account"])
    if mode == "account":
        c.user(c.say(["How do I change the address saved on my account? I moved.",
                      "I've moved house - where do I update my address?",
                      "need to update my default shipping address",
                      "Where can I change my saved address?"]))
        c.bot("You can update it under Account > Addresses: add the new address and set it as default. That "
              "applies to future orders only; if an order hasn't shipped yet, tell me its number and I'll "
              "try to change it too.")
        if c.maybe(0.2):
            c.close()
        return
    o = c.new_order("processing" if mode == "processing" else "in_transit")
    new = c.address()
    c.protect.append(new)
    has = opening(c, [
        f"Can you change the delivery address on {o.number} to {new}?",
        f"I put the wrong address on order {o.number}! It should be {new}.",
        f"Please ship {o.number} to {new} instead, I've moved.",
    ], [
        "I entered the wrong delivery address, can you fix it?",
        "Can I change where my order is being delivered?",
        "wrong address on my order, help",
    ], p_number=0.4)
    if not has:
        c.bot(c.pick(["Sure - what's the order number, and the new address including the postcode?",
                      "I can check that. Which order is it (FH- and seven digits), and what's the new address?"]))
        c.user(c.say([f"{o.number}, new address {new}", f"Order {o.number}. It should go to {new}",
                      f"{o.number} - {new}", f"It's {o.number} and the address is {new}"]))
    if mode == "processing":
        c.call("update_address", {"order_id": o.number, "address": new},
               {"order_id": o.number, "ship_to": new, "status": "processing"})
        c.bot(f"Updated - order {o.number} will now ship to {new}. You'll get a confirmation email; the "
              "address can only be changed until the order ships.")
    else:
        c.call("update_address", {"order_id": o.number, "address": new},
               {"error": "already shipped", "carrier": o.carrier, "tracking": o.tracking})
        c.bot(f"I'm sorry, order {o.number} is already on its way with {o.carrier} (tracking {o.tracking}), so "
              "I can't change the address anymore. You can try a redirect on the carrier's tracking page; if "
              "the parcel comes back to us, we'll reship it or refund you.")
    if c.maybe(0.2):
        c.close()
