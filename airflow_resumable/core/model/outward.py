"""Text as it may leave the process: one sanitizer, :func:`outward_text`, for every text about an attempt
that goes out (a log line about an error, a span's attributes and events, a lineage facet, XCom, the
REST API, the CLI, the UI). No Airflow here.

It holds against two things:

* **Credentials.** A URL loses its user, password, query, fragment and path parameters
  (:func:`without_credentials`); a ``user:password@host`` with no scheme (``u:p@h:5432/db``,
  ``//u:p@h``) loses ``user:password``; the value of a pair whose key names a secret becomes ``***``
  (``password=...``, ``"client_secret": "..."``, ``Authorization: Bearer ...``, ``X-Api-Key: ...``); a
  bare ``Bearer ...`` loses its token; a PEM private key block loses its body. A key names a secret
  by a rule, not a list of spellings (:func:`secret_key`): it is split into words (``camelCase``,
  ``snake_case``, ``kebab-case``, dots), and it names a secret when its words, run together, hold a
  secret stem (``pass``, ``pwd``, ``secret``, ``token``, ``auth`` but not ``author``, ``cred``,
  ``cookie``, ``session``, ``bearer``, ``jwt``, ``signature``, ``apikey``, ``privatekey``...) or one of
  its words is a short secret word (``pw``, ``pin``, ``otp``, ``sid``, ``sig``...). So ``PGPASSWORD``,
  ``passphrase``, ``aws_secret_access_key``, ``refreshToken`` and ``x-auth-token`` are all caught by
  the same few stems.
* **Control characters.** C0 controls other than a line feed and a tab (a carriage return
  included), DEL, C1 controls, the bidirectional overrides and isolates (U+202A-U+202E,
  U+2066-U+2069, U+200E, U+200F, U+061C) and the line and paragraph separators (U+2028, U+2029)
  are written as Python writes them in a string (``\\x1b``, ``\\r``, ``\\u202e``): an escape sequence
  reaches a terminal or a page as text, never as a command.

What it cannot see: a secret with no key, no URL and no ``Bearer`` around it (``hunter2`` alone, or
``the password is hunter2``); a key it does not know as secret (``login=...``, ``key=...``); an
unquoted value holding a space, a quote, ``,``, ``;`` or ``&`` (it ends there; a quoted value is masked
to its closing quote).

Every pass is linear in the text's length: each pattern starts only where a run of its characters
starts (the look-behinds) and scans forward without nested repetition, so a 10 MB message takes
seconds, not hours.
"""

from __future__ import annotations

import functools
import re

__all__ = ["ELLIPSIS", "MASK", "TEXT_LIMIT", "cut_text", "outward_text", "secret_key", "visible", "without_credentials"]

#: What ends a cut text.
ELLIPSIS = "..."
#: The longest text (a job, a slot, a name) an event carries, in characters, the cut's ``...`` included.
TEXT_LIMIT = 1000
#: What a secret becomes.
MASK = "***"


def cut_text(text: str, limit: int = TEXT_LIMIT) -> str:
    """``text``, or, when longer than ``limit`` characters, its start and ``...``: never more than
    ``limit`` characters in all (a schema's ``maxLength: limit`` holds). Every cut of an outgoing
    text goes through here."""
    if len(text) <= limit:
        return text
    if limit < len(ELLIPSIS):
        return text[:max(limit, 0)]
    return text[:limit - len(ELLIPSIS)] + ELLIPSIS


def without_credentials(url: str) -> str:
    """A URL without its user, password, query, fragment and path parameters (``s3://key:secret@bucket/k?sig=x``
    -> ``s3://bucket/k``): what may leave the task. A plain path is returned as it is.

    Read by hand, not by ``urlsplit``: a secret may hold a ``/`` (AWS secret keys do), which ends
    ``urlsplit``'s authority early and leaves the rest of the secret in the path. What stands before
    the last ``@`` is taken for credentials when it has no ``/``, or a ``:`` before its first ``/``
    (``user:pass@host:/path``, ``s3://key:se/cret@bucket/k``); an ``@`` in a path
    (``s3://bucket/v@2.csv``) stays.
    """
    text = url.split("#", 1)[0].split("?", 1)[0]
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = "", text
    before, at, after = rest.rpartition("@")
    if at and ("/" not in before or ":" in before.split("/", 1)[0]):
        rest = after
    if sep:
        host, slash, path = rest.partition("/")
        rest = host.lower() + slash + path
    rest = re.sub(r";[^/]*", "", rest)  # path parameters (;jsessionid=...)
    return f"{scheme}{sep}{rest}"


# -- control characters -----------------------------------------------------------------------------

#: C0 but the line feed and the tab, DEL, C1, the bidi marks, overrides and isolates, the line and
#: paragraph separators.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\r": "\\r"}
#: Each of them and how it is written: ``\\x1b``, ``\\r``, ``\\u202e`` (``str.translate``: one pass in C).
_WRITTEN = {code: _NAMED.get(chr(code)) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
            for code in range(0x2070) if _UNSAFE.match(chr(code))}


def visible(text: str) -> str:
    """``text`` with each control character, DEL, C1 control, bidi override or isolate and line or
    paragraph separator written out as Python writes it in a string (``\\x1b``, ``\\r``, ``\\u202e``); a
    line feed and a tab stay. Part of :func:`outward_text`, which every outgoing text goes through."""
    return text.translate(_WRITTEN) if _UNSAFE.search(text) else text


# -- which key names a secret -----------------------------------------------------------------------

#: A key names a secret when its words, run together and in lower case, hold one of these
#: (``PGPASSWORD``, ``passphrase``, ``x-auth-token``, ``aws_secret_access_key``, ``apiKey``).
SECRET_STEMS = ("pass", "pwd", "secret", "token", "auth", "cred", "cookie", "session", "bearer", "jwt",
                "signature", "apikey", "accesskey", "privatekey", "accountkey", "clientkey", "masterkey",
                "signingkey", "encryptionkey", "sharedkey", "sshkey", "sas")
#: ... or when one of its words is one of these (too short to look for inside a word).
SECRET_WORDS = frozenset({"pw", "pin", "otp", "sid", "sig", "psk", "mfa", "totp"})
#: ``auth`` inside these is no secret (``author``, ``authority``); ``authorization`` is.
_NOT_AUTH = re.compile(r"author(?!i[sz])")
_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
_SEPARATED = re.compile(r"[^a-z0-9]+")


@functools.lru_cache(maxsize=4096)
def secret_key(key: str) -> bool:
    """Whether ``key`` (of a ``key=value`` or ``"key": value`` pair) names a secret: split into words
    (``camelCase``, ``snake_case``, ``kebab-case``, dots; or at its separators only, whatever its case),
    it holds a word of :data:`SECRET_WORDS`, or its words run together hold a stem of
    :data:`SECRET_STEMS` (``auth`` not counted inside ``author``)."""
    words = [w.lower() for w in _WORDS.findall(key)]
    if any(w in SECRET_WORDS for w in (*words, *_SEPARATED.split(key.lower()))):  # userPw, pW
        return True
    joined = _NOT_AUTH.sub("", "".join(words))
    return any(stem in joined for stem in SECRET_STEMS)


# -- the passes -------------------------------------------------------------------------------------

# Each starts only where a run of its characters starts (the look-behinds): linear in the text's length,
# a 10 MB message included (without them, a long run of letters took quadratic time).
_URL_IN_TEXT = re.compile(r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*://\S+")
_URL_TAIL = re.compile(r"[\'\")\]}>.,;:!]+$")

#: ``user:password@`` with no scheme before it: a user (no ``/``, ``@`` or ``:``), a password (no ``@``),
#: from where a word starts. What may stand before the user and stays (``dsn=``, ``//``, ``(``) is cut
#: off by :func:`_userinfo`.
_WORD_EDGE = "\\s'\"<>()\\[\\]{}`"
_USERINFO = re.compile(rf"(?<![^{_WORD_EDGE}])(?://)?[^{_WORD_EDGE}/@:]*:(?!//)[^{_WORD_EDGE}@]*@(?=[^{_WORD_EDGE}@])")
_REST_OF_WORD = re.compile(rf"[^{_WORD_EDGE}]*")

_PAIR_IN_TEXT = re.compile(r"(?<![A-Za-z0-9_.-])([A-Za-z0-9_.-]+)([\'\"]?[ \t]*[=:][ \t]*([\'\"]?))")
_PAIR_VALUE = re.compile(r"[^\s\'\",;&]+")
_QUOTED = {"'": re.compile(r"(?:[^'\\\n]|\\.)*"), '"': re.compile(r'(?:[^"\\\n]|\\.)*')}
#: A value that is itself the next pair's key, a header's (``Authorization: token: ...``): left for
#: that pair when its key names a secret too.
_KEY_AHEAD = re.compile(r"([A-Za-z0-9_.-]+)[ \t]*:[ \t]+")
#: An HTTP authorization scheme, whose credentials follow it (``Bearer x``, ``Basic x``).
_SCHEME = re.compile(r"(?:bearer|basic|digest|token|negotiate|ntlm|hmac|apikey|aws4-hmac-sha256)[ \t]+", re.IGNORECASE)
_LINE_END = re.compile(r"[^\n]*")
_BEARER = re.compile(r"(?<![A-Za-z0-9_-])(bearer[ \t]+)[^\s\'\",;&]+", re.IGNORECASE)
_PEM = re.compile(r"-----BEGIN ([A-Z0-9 ]*)PRIVATE KEY-----")


def _urls(text: str) -> str:
    def url(match: re.Match[str]) -> str:
        token = match.group(0)
        tail = _URL_TAIL.search(token)
        end = tail.start() if tail else len(token)
        return without_credentials(token[:end]) + token[end:]

    return _URL_IN_TEXT.sub(url, text)


def _userinfo(text: str) -> str:
    """Each ``user:password@host`` with no scheme (``u:p@h:5432/db``, ``//u:p@h``, ``dsn=u:p@h``) as
    ``***@host``; a password holding an ``@`` is masked to the word's last ``@`` before a ``/``."""
    out: list[str] = []
    at = 0
    while (match := _USERINFO.search(text, at)) is not None:
        user = match.group(0).split(":", 1)[0]
        lead = max(user.rfind("="), user.rfind(","), user.rfind(";"), user.rfind("|")) + 1 or (
            2 if user.startswith("//") else 0)
        start = match.start() + lead
        word_end = _REST_OF_WORD.match(text, match.end()).end()  # type: ignore[union-attr]
        rest = text[match.end():word_end]
        last = rest.split("/", 1)[0].rfind("@")
        end = match.end() + last + 1 if last >= 0 else match.end()
        out.append(text[at:start] + MASK + "@")
        at = end
    return "".join(out) + text[at:] if out else text


def _pairs(text: str) -> str:
    """The value of each pair whose key names a secret (:func:`secret_key`) as ``***``: a quoted one to
    its closing quote, an unquoted one to a space, a quote, ``,``, ``;`` or ``&``; after an authorization
    scheme (``Authorization: Bearer x``), the credentials only; a cookie's, to the end of its line."""
    out: list[str] = []
    at = 0
    while (match := _PAIR_IN_TEXT.search(text, at)) is not None:
        out.append(text[at:match.end()])
        at = match.end()
        key, quote = match.group(1), match.group(3)
        if not secret_key(key):
            continue
        if quote:
            value = _QUOTED[quote].match(text, at)
        elif (ahead := _KEY_AHEAD.match(text, at)) is not None and secret_key(ahead.group(1)):
            continue  # its value is the next pair (``Authorization: token: x``)
        else:
            scheme = _SCHEME.match(text, at) if "auth" in key.lower() else None
            if scheme is not None:
                out.append(scheme.group(0))
                at = scheme.end()
            value = (_LINE_END if "cookie" in key.lower() else _PAIR_VALUE).match(text, at)
        if value is not None and value.end() > at:
            out.append(MASK)
            at = value.end()
    return "".join(out) + text[at:] if out else text


def _private_keys(text: str) -> str:
    """Each PEM private key block's body as ``***`` (to its END line, else to the end of the text)."""
    out: list[str] = []
    at = 0
    while (match := _PEM.search(text, at)) is not None:
        end_line = f"-----END {match.group(1)}PRIVATE KEY-----"
        end = text.find(end_line, match.end())
        out.append(text[at:match.end()] + MASK)
        at = len(text) if end < 0 else end
    return "".join(out) + text[at:] if out else text


def outward_text(text: str, limit: int | None = None) -> str:
    """``text`` (an error's message, a traceback, a stop reason, who asked) as it may leave the process:
    control characters made visible (:func:`visible`), then credentials removed: URLs through
    :func:`without_credentials`, ``user:password@host`` with no scheme, the values of pairs whose key
    names a secret (:func:`secret_key`), ``Bearer`` tokens and PEM private keys become ``***``. See the
    module's docstring for what it holds against and what it cannot see.

    With a ``limit``, the result is at most ``limit`` characters (:func:`cut_text`), and only the start
    of a longer text is read: the word the limit falls in is dropped whole, so no half of a URL (its
    ``@`` beyond the limit) is left to keep its password.
    """
    if not isinstance(text, str):
        text = str(text)
    if limit is not None and len(text) > limit:
        start = text[:limit + 1]
        text = start[:max(start.rfind(" "), start.rfind("\n"), start.rfind("\t"), 0)] + ELLIPSIS
    text = _bearer(_userinfo(_pairs(_private_keys(_urls(visible(text))))))
    return text if limit is None else cut_text(text, limit)


def _bearer(text: str) -> str:
    return _BEARER.sub(lambda m: m.group(1) + MASK, text)
