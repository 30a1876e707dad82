"""Passwords out of what kvcli prints: a Redis URL masked for display (:func:`mask_url`), an error message or a
command line scrubbed of a URL's secrets (:func:`redact`, :func:`mask_argv`).

Standard library only, so any layer (the CLI's error handler, a JSON document's provenance) can use it."""
from __future__ import annotations

import contextlib
import re
from urllib.parse import parse_qs, unquote, urlsplit

_QUERY_PASSWORD = re.compile(r"([?&;]password=)[^&;#]*", re.IGNORECASE)


def mask_url(url: str) -> str:
    """``url`` with every password replaced by ``***``: the userinfo's (``user:secret@``, ``:secret@``, and a bare
    ``secret@`` that redis-py would read as a user name), ``?password=`` / ``&password=``, percent-encoded or not,
    even in a URL too malformed to parse (a ``/`` or ``#`` in an unencoded password). Safe to print."""
    text = _QUERY_PASSWORD.sub(r"\1***", url)
    scheme, sep, rest = text.partition("://")
    if sep and "@" in rest and not rest.startswith("/"):  # unix:///path@x.sock has no userinfo
        userinfo, _, host = rest.rpartition("@")
        user = userinfo.partition(":")[0] if ":" in userinfo else ""
        text = f"{scheme}://{user}:***@{host}" if userinfo else text
    return text


def url_secrets(url: str) -> list[str]:
    """The passwords a URL carries (as written and percent-decoded), longest first: for scrubbing free text."""
    found: set[str] = set()
    with contextlib.suppress(ValueError):
        parts = urlsplit(url)
        for value in (parts.password, parts.username if parts.password is None else None):
            if value:
                found.update((value, unquote(value)))
        for value in parse_qs(parts.query).get("password", []):
            found.update((value, unquote(value)))
    _, sep, rest = url.partition("://")
    if sep and "@" in rest and not rest.startswith("/"):
        userinfo = rest.rpartition("@")[0]
        secret = userinfo.partition(":")[2] if ":" in userinfo else userinfo
        if secret:
            found.update((secret, unquote(secret)))
    for m in _QUERY_PASSWORD.finditer(url):
        value = url[m.end(1):m.end()]
        if value:
            found.update((value, unquote(value)))
    return sorted((s for s in found if s), key=len, reverse=True)


def redact(text: str, url: str | None) -> str:
    """``text`` (an error message) with every password of ``url`` replaced by ``***`` (see :func:`mask_url`)."""
    if not url:
        return text
    text = text.replace(url, mask_url(url))
    for secret in url_secrets(url):
        text = text.replace(secret, "***")
    return text


_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S*")


def mask_argv(argv: list[str] | tuple[str, ...]) -> list[str]:
    """A command line with every URL in it (``--redis-url URL``, ``--redis-url=URL``, a URL anywhere in an
    argument) passed through :func:`mask_url`; other arguments as they are. Safe to print and to save."""
    return [_URL_IN_TEXT.sub(lambda m: mask_url(m[0]), arg) for arg in argv]
