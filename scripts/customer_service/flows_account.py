"""Intents about accounts and the Trail Club membership. The assistant never asks for a password,
masks e-mail addresses, and makes no security change itself: self-service, or a request for the
security team through `account_request`."""

from __future__ import annotations

import datetime as dt

from .convo import Convo, opening
from .pools import CLUB, SUPPORT_EMAIL, fmt_date

ASK_EMAIL = ["What email address is your account registered with?", "Which email address do you use to log in?"]


def request(c: Convo, kind: str, **extra) -> dict:
    res = {"reference": c.fresh_id("CS-", 6), "confirmation_sent_to": c.masked_email()}
    res.update(extra)
    return c.call("account_request", {"email": c.email, "type": kind}, res)


def flow_password_reset(c: Convo) -> None:
    mode = c.pick(["forgot", "forgot", "no_email", "unknown", "shared"])
    if mode == "shared":
        pw = c.pick(["Trailhead2023", "hunter22!", "maple*leaf9", "Summer2024"])
        c.user(c.say([f"I can't log in. My email is {c.email} and my password is {pw}, can you check?",
                      f"Login not working. {c.email} / {pw}",
                      f"my login is {c.email}, password {pw}, it says wrong password"]))
        res = c.call("send_password_reset", {"email": c.email},
                     {"sent_to": c.masked_email(), "valid_minutes": 60})
        c.bot("Please don't share your password with anyone, including us - I'll never need it, and since it's "
              f"now in this chat, please change it. I've sent a reset link to {res['sent_to']}; it's valid for "
              f"{res['valid_minutes']} minutes.")
        if c.maybe(0.2):
            c.close()
        return
    texts = {
        "forgot": ["I forgot my password.", "Can't log in, forgot my password", "How do I reset my password?",
                   "I can't remember my password and the site keeps saying it's wrong.",
                   "password reset please"],
        "no_email": ["I requested a password reset but never got the email.",
                     "reset password email not arriving", "The reset link email isn't coming through."],
    }
    opening(c, [], texts["no_email" if mode == "no_email" else "forgot"])
    c.bot(c.pick(["I can help with that.", "No problem.", "Sure."]) + " " + c.pick(ASK_EMAIL))
    c.give_email()
    if mode == "unknown":
        c.call("send_password_reset", {"email": c.email}, {"error": "no account with this email"})
        c.bot("I can't find an account under that address. Could it be registered under another email? If you "
              "checked out as a guest, there's no password - you can create an account with the same email.")
        c.user(c.say(["Oh, maybe my work email. I'll try that.", "hmm ok I'll check", "I'll look, thanks."]))
        c.bot("Sounds good - just send me the other address if you'd like me to send the link there.")
        return
    res = c.call("send_password_reset", {"email": c.email}, {"sent_to": c.masked_email(), "valid_minutes": 60})
    if mode == "forgot":
        c.bot(f"Thanks. I've sent a reset link to {res['sent_to']}; it's valid for {res['valid_minutes']} "
              "minutes. If it doesn't arrive in a few minutes, check your spam folder.")
    else:
        c.bot(f"Thanks. I've sent a new link to {res['sent_to']} from {SUPPORT_EMAIL}. It sometimes lands in "
              "spam or promotions, so please check there; only the newest link works.")
    if c.maybe(0.2):
        c.close()


def flow_two_factor(c: Convo) -> None:
    mode = c.pick(["lost_phone", "lost_phone", "sms"])
    if mode == "lost_phone":
        opening(c, [], ["I lost my phone and can't get the 2FA code to log in.",
                        "New phone, my authenticator app is gone. How do I get into my account?",
                        "locked out - two factor codes go to my old phone",
                        "I got a new phone and now I can't log in because of two-step verification."])
        c.bot("I'm sorry, that's a stressful one. Do you have the backup codes you got when you turned on "
              "two-factor authentication? Each one works once instead of a code from your phone.")
        if c.maybe(0.4):
            c.user(c.say(["Oh yes, I saved them somewhere. I'll try that.", "found them in my notes app",
                          "yes I have those"]))
            c.bot("Great. Enter one on the code screen, then set up two-factor on your new phone under "
                  "Account > Security.")
            return
        c.user(c.say(["No, I never saved them.", "I don't have those", "no idea where they are"]))
        c.bot("No problem. For your security I can't turn off two-factor authentication from this chat, but I "
              "can start an account recovery request. " + c.pick(ASK_EMAIL))
        c.give_email()
        res = request(c, "recovery")
        c.bot(f"Thank you. Recovery request {res['reference']} is open; our security team will email "
              f"{res['confirmation_sent_to']} to verify your identity. We will never ask for your password.")
    else:
        opening(c, [], ["I'm not getting the SMS code to log in.", "2FA text message never arrives",
                        "The verification code by SMS isn't coming through, I've tried three times.",
                        "no sms code"])
        c.bot("Sorry about that. Which email is the account under? I'll check which number the codes go to.")
        c.give_email()
        last2 = "".join(c.rng.choice("0123456789") for _ in range(2))
        res = c.call("lookup_account", {"email": c.email},
                     {"email": c.masked_email(), "sms_2fa_phone_ending": last2, "membership": None})
        c.bot(f"The codes go to the number ending in {res['sms_2fa_phone_ending']} - is that still yours? Codes "
              "can take up to a minute, and each resend cancels the previous code.")
        if c.maybe(0.5):
            c.user(c.say(["Yes that's my number. Ok it just came through.", "yes, trying again... got it",
                          "yes, it worked now"]))
            c.bot("Glad it worked! An authenticator app under Account > Security works even without signal.")
        else:
            c.user(c.say(["No, I changed my number.", "that's my old number", "No, that's not mine anymore."]))
            res = request(c, "recovery")
            c.bot(f"For security I can't change the number from chat, so I've opened recovery request "
                  f"{res['reference']}; our security team will email {res['confirmation_sent_to']} to verify "
                  "your identity and update it.")
    if c.maybe(0.2):
        c.close()


def flow_email_change(c: Convo) -> None:
    mode = c.pick(["self_service", "self_service", "locked_out"])
    if mode == "self_service":
        opening(c, [], ["How do I change the email address on my account?", "I want to update my email.",
                        "I'm switching email providers - how do I change my login email?",
                        "Can you change my account email?"])
        c.bot("For security I can't change the login email from chat, but you can do it under Account > "
              "Profile > Email. We'll send a confirmation link to the new address, and a notice to the old one.")
        if c.maybe(0.4):
            c.exchange([(["Will my order history stay?", "Does this affect my Trail Club membership?",
                          "do I lose my orders?"],
                         "Everything stays on the same account - orders, returns and membership. Only the login "
                         "email changes.")])
    else:
        c.user(c.say(["I can't log in and I no longer have access to my old email address.",
                      f"My old email {c.email} was deleted and now I'm locked out of my account.",
                      "locked out, my old email account is gone"]))
        c.bot("I'm sorry, that's frustrating. I can't change the email from chat, but I can start an account "
              "recovery request. What was the old email address on the account?")
        c.give_email()
        res = request(c, "recovery")
        c.bot(f"Thank you. Recovery request {res['reference']} is open; our security team will contact you "
              "to verify your identity. We will never ask for your password.")
    if c.maybe(0.2):
        c.close()


def flow_account_deletion(c: Convo) -> None:
    kind = c.pick(["deletion", "deletion", "data_export"])
    if kind == "deletion":
        opening(c, [], ["Please delete my account and all my data.", "I want my account deleted under GDPR.",
                        "How do I close my account? I don't want you keeping my information.",
                        "Right to erasure request: delete everything you have on me.",
                        "Delete my account please. Stop emailing me."])
    else:
        opening(c, [], ["Can I get a copy of all the data you hold about me?",
                        "I'd like to make a subject access request.",
                        "What personal data do you have on me? I want a copy (GDPR)."])
    c.bot(c.pick(["I can help with that.", "Of course."]) + " Which email address is the account registered with?")
    c.give_email()
    res = request(c, kind)
    if kind == "deletion":
        c.bot(f"Thank you. Deletion request {res['reference']} is open, and we've emailed "
              f"{res['confirmation_sent_to']} to confirm it came from you. Once you confirm, the account and "
              "personal data are deleted within 30 days; order and invoice records are kept for tax purposes only.")
        if c.maybe(0.4):
            c.exchange([
                ([f"Will my {CLUB} membership be cancelled too?", "Do I need to cancel my membership separately?",
                  "what about my membership"],
                 f"No need - deleting the account ends the {CLUB} membership, with no further charges."),
                (["Can I undo it if I change my mind?", "what if i change my mind", "Is it reversible?"],
                 "Nothing is deleted until you click the confirmation link. After that it can't be undone."),
            ])
    else:
        c.bot(f"Thanks. Data access request {res['reference']} is open. We'll email {res['confirmation_sent_to']} "
              "to confirm it's you, then send a secure download link with your data within 30 days.")
    if c.maybe(0.2):
        c.close()


def flow_subscription_cancel(c: Convo) -> None:
    plan = c.pick(["monthly", "annual_recent", "annual_old"])
    opening(c, [], [f"I want to cancel my {CLUB} membership.", f"How do I stop my {CLUB} subscription?",
                    f"Please cancel my {CLUB} - I don't use it enough.",
                    "Cancel my subscription please, you charged me again.",
                    f"I'd like to end the {CLUB} membership before it renews."])
    c.bot(c.pick(["I can help with that.", "Sure.", "Of course."]) + " Which email address is the membership under?")
    c.give_email()
    cur = c.currency_code()
    if plan == "monthly":
        end = c.today + dt.timedelta(days=c.rng.randint(3, 27))
        m = {"plan": "monthly", "price": 5.99, "currency": cur, "paid_until": end.isoformat()}
        text = (f"You're on the monthly {CLUB} plan ({c.money(5.99)} a month), paid until {fmt_date(end)}. If I "
                "cancel, it won't renew and you keep the benefits until then. Shall I cancel it?")
    elif plan == "annual_recent":
        renewed = c.today - dt.timedelta(days=c.rng.randint(1, 13))
        m = {"plan": "annual", "price": 49.0, "currency": cur, "renewed": renewed.isoformat(),
             "refundable": True}
        text = (f"Your annual {CLUB} membership ({c.money(49)}) renewed on {fmt_date(renewed)}. That's within 14 "
                f"days, so I can cancel it and refund the {c.money(49)} in full. Shall I go ahead?")
    else:
        end = c.today + dt.timedelta(days=c.rng.randint(30, 300))
        m = {"plan": "annual", "price": 49.0, "currency": cur, "paid_until": end.isoformat(), "refundable": False}
        text = (f"Your annual {CLUB} membership ({c.money(49)}) runs until {fmt_date(end)}. The renewal was more "
                "than 14 days ago, so I can't refund it, but I can turn off the renewal and you keep the benefits "
                "until then. Shall I?")
    c.call("lookup_account", {"email": c.email}, {"email": c.masked_email(), "membership": m})
    c.bot(f"Thanks. {text}")
    c.user(c.say(["Yes please.", "yes cancel it", "Go ahead.", "Yes. Thanks."]))
    extra = {"refund": 49.0, "currency": cur} if plan == "annual_recent" else {}
    res = request(c, "cancel_membership", **extra)
    tail = (f" Your {c.money(res['refund'])} refund goes back to the original payment method within 5-7 "
            "business days." if "refund" in res else "")
    c.bot(f"Done - your {CLUB} membership is cancelled (reference {res['reference']}), and a confirmation is "
          f"on its way to {res['confirmation_sent_to']}.{tail}")
    if c.maybe(0.2):
        c.close()
