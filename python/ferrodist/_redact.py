"""URLs as they may be shown: the password of a ``user:password@`` replaced.

Why: an ``init_method`` URL is echoed in error messages (torch's own wording repeats it), and a
message ends up in logs and bug reports. ferrodist refuses a password in an ``etcd://`` URL, and
the message that says so, like every other message that quotes a URL, quotes it through
:func:`redact_url` so that the refused password is not the thing it leaks.
"""

from __future__ import annotations

__all__ = ["REDACTED", "redact_url"]

REDACTED = "<redacted>"


def redact_url(url: str) -> str:
    """``url`` with the password of its user info (``user:password@``) replaced; the user name,
    hosts, path and query are kept. A URL without a password comes back unchanged.

    The user info runs to the last ``@`` before the query, not to the first ``/``: a password
    with an unescaped ``/`` in it is still hidden (a path with an ``@`` is hidden with it)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    head_end = min((i for i in (rest.find("?"), rest.find("#")) if i != -1), default=len(rest))
    at = rest.rfind("@", 0, head_end)
    if at == -1:
        return url
    user, has_password, _ = rest[:at].partition(":")
    shown = f"{user}:{REDACTED}" if has_password else user
    return f"{scheme}{sep}{shown}@{rest[at + 1 :]}"
