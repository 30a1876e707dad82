"""Where two prompts first differ, said so a person can fix it: the message, its role and field for chat prompts,
the token position otherwise, with an excerpt of both sides around the first differing text.

Chat prompts are compared as messages, in order, the way a template renders them: the first message whose role,
text (:func:`kvcli.model.tokenizer_base.message_text`: content, then tool calls) or other fields differ is the
site (``messages[i] (role) content``); a difference in the requests' ``tools`` ahead of it (templates render tools
in or after the leading system message) is ``tools``; when every message compared is equal but the token ids still
differ, the chat template itself rendered them differently (a date it inserts, history it rewrites):
``messages[i] (role) template``, ``i`` the first message past the equal ones. Excerpts are cut around the first
differing character (messages) or decoded around the first differing token (text prompts, templates).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from kvcli.errors import BadInputError
from kvcli.model.tokenizer_base import message_text
from kvcli.traces.request import ChatPrompt

#: characters of an excerpt on each side of the first difference; tokens decoded on each side for token excerpts.
EXCERPT_CHARS = 24
EXCERPT_TOKENS = 12


class Site(NamedTuple):
    """Where a prompt first differs from its predecessor.

    Attributes:
        label: the place as reports print it and group by: ``messages[0] (system) content``, ``tools``,
            ``messages[2] (user) template``, ``token 40`` (text and token-id prompts) or ``hash_ids[1]`` (hash-id
            traces: the block).
        token: the first differing token's position (0-based).
        message_index: the message (0-based) for chat prompts, else None. role: its role, else None.
        field: ``content`` (the message's text), ``role``, ``name`` or another message key, ``tools``, ``template``,
            ``tokens`` or ``hash_ids`` (a hash-id trace's block).
        ours, theirs: excerpts of this prompt and of the predecessor around the difference (None: no text).
    """

    label: str
    token: int
    message_index: int | None = None
    role: str | None = None
    field: str = "tokens"
    ours: str | None = None
    theirs: str | None = None


def locate(ours: ChatPrompt | None, theirs: ChatPrompt | None, ours_tokens: np.ndarray | None,
           theirs_tokens: np.ndarray | None, position: int,
           decode: Callable[[np.ndarray], str] | None, block_tokens: int | None = None,
           render: Callable[[ChatPrompt], np.ndarray] | None = None) -> Site:
    """The :class:`Site` where a prompt first differs from its predecessor, whose token ids first differ at
    ``position``. ``ours``/``theirs``: the chat messages (None for other prompts); ``*_tokens``: ``[tokens]`` ids
    (None: no excerpt); ``decode``: ids -> text (None: no text excerpt); ``block_tokens``: a hash-id trace's tokens
    per hash id, so the site is the hash id (``hash_ids[k]``, ``k = position // block_tokens``: its synthesized
    tokens can agree on a first token or so by chance); ``render``: a chat prompt's ids under the template without
    the generation prompt, to find the message whose rendering holds ``position`` when the template made the
    difference (:func:`rendering_message`; None: the first message past the equal ones)."""
    if ours is not None and theirs is not None:
        site = _chat_site(ours, theirs, position)
        if site is not None:
            return site
        i = _first_unequal(ours.messages, theirs.messages)
        if render is not None:
            i = rendering_message(ours, position, render, i)
        role = ours.messages[i].get("role") if i < len(ours.messages) else "generation prompt"
        a, b = _token_excerpts(ours_tokens, theirs_tokens, position, decode)
        return Site(f"messages[{i}] ({role}) template", position, i, role, "template", a, b)
    if block_tokens:
        return Site(f"hash_ids[{position // block_tokens}]", position, field="hash_ids")
    a, b = _token_excerpts(ours_tokens, theirs_tokens, position, decode)
    return Site(f"token {position}", position, ours=a, theirs=b)


def _chat_site(ours: ChatPrompt, theirs: ChatPrompt, position: int) -> Site | None:
    """The message-level site, or None when the messages (and tools) compared are all equal."""
    mine, other = ours.messages, theirs.messages
    i = _first_unequal(mine, other)
    leading_system = 1 if mine and isinstance(mine[0], dict) and mine[0].get("role") == "system" else 0
    if (ours.tools or None) != (theirs.tools or None) and i >= leading_system:
        a, b = excerpts(_tools_text(ours.tools), _tools_text(theirs.tools))
        return Site("tools", position, field="tools", ours=a, theirs=b)
    if i >= len(mine) or i >= len(other):
        return None
    m, o = mine[i], other[i]
    role = m.get("role")
    if m.get("role") != o.get("role"):
        return Site(f"messages[{i}] ({role}) role", position, i, role, "role", str(role), str(o.get("role")))
    text_m, text_o = _text(m), _text(o)
    if text_m != text_o:
        a, b = excerpts(text_m, text_o)
        return Site(f"messages[{i}] ({role}) content", position, i, role, "content", a, b)
    key = next((k for k in sorted(set(m) | set(o)) if m.get(k) != o.get(k)), "content")
    a, b = excerpts(str(m.get(key, "")), str(o.get(key, "")))
    return Site(f"messages[{i}] ({role}) {key}", position, i, role, key, a, b)


def rendering_message(chat: ChatPrompt, position: int, render: Callable[[ChatPrompt], np.ndarray],
                      default: int) -> int:
    """The message whose rendering holds token ``position`` of ``chat``'s prompt: the last ``i`` whose first ``i``
    messages render to at most ``position`` tokens (``len(messages)``: the generation prompt). Templates that do not
    render a conversation's first messages as a prefix of the whole (or refuse a partial one) give ``default``."""
    messages = list(chat.messages)
    i = 0
    try:
        for k in range(1, len(messages) + 1):
            if len(render(ChatPrompt(messages[:k], chat.tools))) > position:
                break
            i = k
    except BadInputError:
        return default
    return i


def _first_unequal(mine, other) -> int:
    """The first index where the two message lists differ (the shorter one's length when one is a prefix)."""
    for i, (m, o) in enumerate(zip(mine, other)):
        if m != o:
            return i
    return min(len(mine), len(other))


def _text(message) -> str:
    try:
        return message_text(message)
    except BadInputError:  # a message the reader accepted renders; anything else is shown as it is
        return str(message.get("content"))


def _tools_text(tools) -> str:
    import json

    return json.dumps(tools, ensure_ascii=False) if tools else "(no tools)"


def excerpts(ours: str, theirs: str, chars: int = EXCERPT_CHARS) -> tuple[str, str]:
    """Both texts cut to ``chars`` characters on each side of their first differing character, with ``…`` where cut
    and newlines shown as ``\\n``."""
    c = next((i for i, (x, y) in enumerate(zip(ours, theirs)) if x != y), min(len(ours), len(theirs)))
    return _cut(ours, c, chars), _cut(theirs, c, chars)


def _cut(text: str, c: int, chars: int) -> str:
    lo, hi = max(0, c - chars), min(len(text), c + chars)
    body = text[lo:hi].replace("\r", "\\r").replace("\n", "\\n")
    return ("…" if lo > 0 else "") + body + ("…" if hi < len(text) else "")


def _token_excerpts(ours: np.ndarray | None, theirs: np.ndarray | None, position: int,
                    decode: Callable[[np.ndarray], str] | None) -> tuple[str | None, str | None]:
    """Text around token ``position`` of both prompts (a few tokens each side, decoded), cut alike around the first
    differing character (:func:`excerpts`)."""
    if ours is None or theirs is None or decode is None:
        return None, None
    lo = max(0, position - EXCERPT_TOKENS)
    return excerpts(decode(ours[lo:position + EXCERPT_TOKENS]), decode(theirs[lo:position + EXCERPT_TOKENS]))
