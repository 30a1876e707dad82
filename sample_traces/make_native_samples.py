"""Writes the three native samples of this folder (chat_shared_system, no_reuse, tokens_small).

Run from the repository root: ``python sample_traces/make_native_samples.py [path/to/sonnet.txt]``.
The sonnet file is vLLM's benchmarks/sonnet.txt (see SOURCES.md); the rest of the text is written here.
Deterministic: running it twice gives the same bytes.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from kvcli.model.tokenize import get_tokenizer

HERE = Path(__file__).resolve().parent

SYSTEM_PROMPT = """\
You are Trailhead, the customer-support assistant of Northwind Outfitters, a shop that sells hiking, \
camping and climbing gear online and in twelve stores.

Follow these rules in every answer:
1. Be brief and concrete. Answer the question first, then give at most three short supporting points.
2. Orders: customers can change or cancel an order until it ships, usually within 24 hours. After that \
they can return it. Never promise a delivery date; quote the carrier's estimate shown on the order page.
3. Returns: unused items can be returned within 60 days with the receipt; used items only if they are \
defective. Refunds go back to the original payment method within 5 to 10 business days. Members of the \
Northwind Club get free return shipping; everyone else pays a flat fee of 6 dollars.
4. Warranty: tents, packs and sleeping bags have a two-year warranty against manufacturing defects. \
Damage from wear, accidents, or misuse is not covered, but the repair shop can often fix it for a fee.
5. Safety: for questions about avalanche gear, climbing ropes, harnesses or carabiners, give general \
information only and recommend a certified guide or instructor. Never tell a customer that gear which \
has been dropped or overloaded is safe to use.
6. Sizing: point to the size chart on each product page; for boots, suggest trying them on in the \
afternoon with the socks the customer plans to hike in.
7. Escalation: if the customer is upset, asks for a manager, reports an injury, or the question is about \
a payment dispute, apologize once and offer to open a ticket with a human agent.
8. Privacy: never ask for full card numbers or passwords. An order number and an email address are enough \
to find an order.
Do not invent products, prices, or store hours. If you do not know, say so and offer to find out."""

# (session_id, cache_salt, [(user, assistant), ...]) -- four turns each; the last answer only sets output_length.
SESSIONS = [
    ("acme-1", "acme", [
        ("Hi, I ordered a two-person tent yesterday. Can I still switch it to the three-person model?",
         "Yes, as long as it has not shipped. Your order is still being packed, so I can switch it now. The "
         "three-person model costs 40 dollars more; the difference will be charged to the same card."),
        ("Great, please switch it. Does the three-person one fit in a normal backpack?",
         "Done, the order now has the three-person tent. Packed, it is about 50 by 18 centimetres and weighs "
         "2.4 kilograms, so it fits most packs of 50 litres or more, or can be strapped underneath."),
        ("And if it turns out too heavy for me, can I return it after a trip?",
         "Only if it is unused or defective. A tent that has been pitched on a trip counts as used, so try it "
         "at home first: pitch it indoors, pack it, and carry it for a walk before you go."),
        ("OK. Last thing: when will it arrive?",
         "I cannot promise a date, but once it ships the carrier's estimate will appear on your order page, "
         "and you will get an email with the tracking link."),
    ]),
    ("acme-2", "acme", [
        ("My sleeping bag's zipper broke after eight months. Is that covered?",
         "A zipper that fails in normal use within two years is a manufacturing defect, so yes, it is covered "
         "by the warranty. I can start a warranty claim with your order number."),
        ("The order number is NW-55213. Do I need to send the bag in?",
         "Yes. I have opened claim W-1187 for order NW-55213. Print the prepaid label from the email I just "
         "sent, pack the bag dry, and drop it at any carrier point."),
        ("How long does the repair take?",
         "Zipper repairs usually take two to three weeks including shipping. If the bag cannot be repaired, "
         "we replace it with the same model or one of equal value."),
        ("Can I get a loaner bag meanwhile? I have a trip in ten days.",
         "We do not have loaners, but I can ask the repair shop to prioritize your claim. Would you also like "
         "the rental options from your nearest store?"),
    ]),
    ("globex-1", "globex", [
        ("I fell while climbing and dropped my carabiner about ten metres onto rock. Is it still OK to use?",
         "I am sorry about the fall; I hope you are unhurt. I cannot tell you that a dropped carabiner is safe. "
         "Hairline cracks are invisible, so the usual advice is to retire it. A certified instructor can advise."),
        ("It looks perfectly fine though. No scratches.",
         "Visible condition says little about internal damage after a hard drop. Please retire it; a new "
         "locking carabiner costs about 15 dollars, which is small next to the risk."),
        ("Fine. Which one should I buy instead?",
         "For general use, a screw-gate HMS carabiner is a common choice. Our product pages list each model's "
         "strength ratings; a guide or instructor can help you choose for your kind of climbing."),
        ("Do you have any in the Denver store?",
         "I cannot see store stock from here, but the product page has a 'check store availability' button. "
         "Choose Denver and it shows what is on the shelf today."),
    ]),
    ("globex-2", "globex", [
        ("What size hiking boots should I get if my sneakers are a 42?",
         "Start with the size chart on the boot's page, since brands differ. Many hikers go half a size up from "
         "their sneakers to leave room for thicker socks and swelling on long descents."),
        ("Should I try them on in the morning or evening?",
         "In the afternoon or evening, when your feet are at their largest, and wear the socks you plan to "
         "hike in. Walk down a slope or stairs to check that your toes do not hit the front."),
        ("If they give me blisters after the first hike, can I return them?",
         "Worn boots can only be returned if they are defective. Break them in at home and on short walks "
         "first; unused boots can be returned within 60 days with the receipt."),
        ("Thanks. Are Northwind Club members getting free return shipping?",
         "Yes, Northwind Club members get free return shipping. Everyone else pays a flat 6-dollar fee."),
    ]),
    ("public-1", "", [
        ("I was charged twice for the same order. I want my money back now!",
         "I am sorry about the double charge. Payment disputes go to a human agent, so I have opened ticket "
         "T-4471 for you; an agent will email you within one business day."),
        ("Can't you just refund it yourself?",
         "I cannot issue refunds for payment disputes myself. The agent will check both charges with the bank; "
         "if one is a duplicate, it is usually reversed within 5 to 10 business days."),
        ("What information do they need from me?",
         "Only your order number and the email address on the order. Never send your full card number or any "
         "password; our agents will never ask for them."),
        ("The order is NW-60982 and my email is on file.",
         "Thank you, I have added order NW-60982 to ticket T-4471. You will get a confirmation email shortly."),
    ]),
    ("public-2", "", [
        ("Do you sell avalanche beacons, and which one is best for a beginner?",
         "We sell several avalanche transceivers. I can only give general information: beginners often prefer "
         "three-antenna models with simple displays. Please take an avalanche safety course before relying on one."),
        ("Is a course really necessary if I read the manual?",
         "Yes. A beacon only helps if you can search fast under stress, which takes practice with a probe and "
         "shovel. A certified instructor or guide can teach companion rescue in a day or two."),
        ("Where can I find a course near Salt Lake City?",
         "I do not have a list of course providers, so I would rather not guess. Your local avalanche center's "
         "website usually lists certified courses; our Salt Lake City store can also point you to some."),
        ("What are that store's opening hours?",
         "I do not want to give you wrong hours. The store page on our website shows today's opening hours; "
         "I can also open a ticket so a colleague there calls you back."),
    ]),
]

TURN_GAP_S = 6.0      # seconds between the turns of one session
SESSION_GAP_S = 1.5   # seconds between the starts of consecutive sessions


def chat_shared_system() -> list[dict]:
    """24 requests: 6 sessions x 4 turns; each turn's messages are the whole conversation so far."""
    tok = get_tokenizer("cl100k_base")
    rows = []
    for s, (session_id, salt, turns) in enumerate(SESSIONS):
        messages = [{"role": "system", "content": SYSTEM_PROMPT}]
        for t, (user, assistant) in enumerate(turns):
            messages.append({"role": "user", "content": user})
            row = {"id": f"{session_id}-t{t + 1}", "timestamp": round(s * SESSION_GAP_S + t * TURN_GAP_S, 3),
                   "session_id": session_id}
            if salt:
                row["cache_salt"] = salt
            row["output_length"] = len(tok.encode(assistant))
            row["messages"] = list(messages)
            rows.append(row)
            messages.append({"role": "assistant", "content": assistant})
    rows.sort(key=lambda r: (r["timestamp"], r["id"]))
    return rows


#: 14-line chunks of sonnet.txt whose first tokens all differ (no two prompts share even one token).
NO_REUSE_CHUNKS = [0, 1, 3, 5, 8, 12, 17, 21, 26, 33]


def no_reuse(sonnet_path: Path) -> list[dict]:
    """10 unrelated plain-text prompts: 14-line chunks of sonnet.txt, no shared prefix."""
    lines = sonnet_path.read_text(encoding="utf-8").splitlines()
    rows = []
    for i, chunk in enumerate(NO_REUSE_CHUNKS):
        text = "\n".join(lines[chunk * 14:(chunk + 1) * 14])
        rows.append({"id": f"sonnet-{chunk}", "timestamp": float(i), "output_length": 64, "prompt": text})
    return rows


def tokens_small() -> list[dict]:
    """Six token_ids records with hand-checkable reuse (see SOURCES.md)."""
    base = list(range(1, 17))
    return [
        {"id": "t1", "timestamp": 0.0, "session_id": "a", "token_ids": base},
        {"id": "t2", "timestamp": 1.0, "session_id": "a", "token_ids": base[:8] + list(range(101, 109))},
        {"id": "t3", "timestamp": 2.0, "session_id": "a", "token_ids": base + [17, 18, 19, 20]},
        {"id": "t4", "timestamp": 3.0, "session_id": "b", "cache_salt": "other", "token_ids": base},
        {"id": "t5", "timestamp": 4.0, "session_id": "b", "token_ids": []},
        {"id": "t6", "timestamp": 5.0, "session_id": "c", "token_ids": list(range(200, 210))},
    ]


def write_jsonl(path: Path, rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def main() -> None:
    sonnet = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("/work/shared/traces/vllm/sonnet.txt")
    write_jsonl(HERE / "chat_shared_system.jsonl", chat_shared_system())
    write_jsonl(HERE / "no_reuse.jsonl", no_reuse(sonnet))
    write_jsonl(HERE / "tokens_small.jsonl", tokens_small())


if __name__ == "__main__":
    main()
