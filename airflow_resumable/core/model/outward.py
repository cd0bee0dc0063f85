"""Text as it may leave the process: one sanitizer, :func:`outward_text`, for every text about an attempt
that goes out (a log line about an error, a span's attributes and events, a lineage facet, XCom, the
REST API, the CLI, the UI). No Airflow here.

It holds against two things:

* **Credentials.** A URL loses its user, password, query, fragment and path parameters
  (:func:`without_credentials`; its userinfo read as libpq reads it, to the ``@`` before the first
  ``/``, a ``#`` or ``?`` included); a ``user:password@host`` with no scheme (``u:p@h:5432/db``,
  ``//u:p@h``) loses ``user:password``; the value of a pair whose key names a secret becomes ``***``
  (``password=...``, ``"client_secret": "..."``, ``'password' => '...'``, ``Authorization: Bearer ...``,
  ``X-Api-Key: ...``): a quoted value to its closing quote (escaped quotes of a JSON text inside a
  string read as its quotes: ``\\"password\\": \\"...\\"``), with the quoted texts that follow a prefix
  (``b'...'``, ``E'...'``, ``'it''s'``), an object, an array or a bracketed text to its closing
  bracket (over lines), a YAML value on the lines after its key, indented deeper; a bare ``Bearer ...``
  loses its token; a PEM block whose label says ``PRIVATE`` loses its body. A key names a secret
  by a rule, not a list of spellings (:func:`secret_key`): it is split into words (``camelCase``,
  ``snake_case``, ``kebab-case``, dots), and it names a secret when its words, run together, hold a
  secret stem (``pass``, ``pwd``, ``secret``, ``token``, ``auth`` but not ``author``, ``cred``,
  ``cookie``, ``session``, ``bearer``, ``jwt``, ``signature``, ``apikey``, ``privatekey``...) or one of
  its words is a short secret word (``pw``, ``pin``, ``otp``, ``sid``, ``sig``...). So ``PGPASSWORD``,
  ``passphrase``, ``aws_secret_access_key``, ``refreshToken`` and ``x-auth-token`` are all caught by
  the same few stems.
* **Control characters.** Every character of the Unicode categories Cc, Cf, Cs, Zl and Zp but a line
  feed and a tab: C0 controls (a carriage return included), DEL, C1 controls, the bidirectional
  marks, overrides and isolates, zero-width spaces and joiners, the soft hyphen, the byte order mark,
  tag characters, lone surrogates, the line and paragraph separators, written as Python writes them
  in a string (``\\x1b``, ``\\r``, ``\\u202e``, ``\\u200b``): an escape sequence reaches a terminal or a
  page as text, never as a command, and an invisible character shows.

What it cannot see: a secret with no key, no URL and no ``Bearer`` around it (``hunter2`` alone, or
``the password is hunter2``, ``--password hunter2``); a key it does not know as secret (``login=...``,
``key=...``), or spelled to hide it (a look-alike letter, an invisible character, percent- or
entity-encoded); an unquoted value holding a space, a quote, ``,``, ``;`` or ``&`` (it ends there; a
quoted value is masked to its closing quote); a text encoded again (base64, percent-encoding, JSON's
``\\u`` escapes); a key or a value broken over two lines.

Every pass is linear in the text's length: each pattern starts only where a run of its characters
starts (the look-behinds) and scans forward without nested repetition, so a 10 MB message takes
seconds, not hours.
"""

from __future__ import annotations

import functools
import re
import sys
import traceback
import unicodedata

__all__ = ["ELLIPSIS", "MASK", "TEXT_LIMIT", "cut_text", "outward_text", "outward_traceback", "secret_key", "visible",
           "without_credentials"]

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

    Read by hand, not by ``urlsplit``, and as libpq reads a connection URI: its userinfo is what stands
    before an ``@`` of the text up to the first ``/``, a ``?`` or a ``#`` included
    (``postgresql://u:pa#ss@h/db``: libpq's password is ``pa#ss``, where ``urlsplit`` sees a fragment);
    the last such ``@`` (a password holding an ``@``). A secret may hold a ``/`` (AWS secret keys do),
    which ends ``urlsplit``'s authority early and leaves the rest of the secret in the path: what stands
    before the word's last ``@`` is taken for credentials too when it has a ``:`` before its first ``/``
    (``user:pass@host:/path``, ``s3://key:se/cret@bucket/k``); an ``@`` in a path (``s3://bucket/v@2.csv``)
    stays.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    authority = rest.split("/", 1)[0]
    if "@" in authority:
        rest = rest[authority.rfind("@") + 1:]
    else:
        before, at, after = rest.rpartition("@")
        if at and ":" in before.split("/", 1)[0]:
            rest = after
    rest = rest.split("#", 1)[0].split("?", 1)[0]
    if sep:
        host, slash, path = rest.partition("/")
        rest = host.lower() + slash + path
    rest = re.sub(r";[^/]*", "", rest)  # path parameters (;jsessionid=...)
    return f"{scheme}{sep}{rest}"


# -- control characters -----------------------------------------------------------------------------

#: The Unicode categories never sent raw: controls (Cc: C0 but the line feed and the tab, DEL, C1),
#: format characters (Cf: the bidi marks, overrides and isolates, zero-width spaces and joiners, the
#: soft hyphen, the byte order mark, tag characters), lone surrogates (Cs: no UTF-8 encoder takes
#: them) and the line and paragraph separators (Zl, Zp). A rule by category, not a list of code points.
UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
_KEPT = frozenset({"\n", "\t"})


def _written(code: int) -> str:
    if chr(code) == "\r":
        return "\\r"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


#: The ASCII ones (C0 but the line feed and the tab, DEL) and how each is written: all an ASCII text needs.
_ASCII_WRITTEN = {code: _written(code) for code in range(128)
                  if unicodedata.category(chr(code)) in UNSAFE_CATEGORIES and chr(code) not in _KEPT}
_ASCII_UNSAFE = re.compile("[" + "".join(re.escape(chr(code)) for code in _ASCII_WRITTEN) + "]")


@functools.cache
def _unsafe() -> tuple[dict[int, str], re.Pattern[str]]:
    """Each character of :data:`UNSAFE_CATEGORIES` and how it is written (``\\x1b``, ``\\r``, ``\\u202e``,
    ``\\U000e0041``: for ``str.translate``, one pass in C), and a pattern that finds one. Made on the first
    text that is not ASCII (a scan of every code point, ~0.1 s), not when the module is imported."""
    written = {code: _written(code) for code in range(sys.maxunicode + 1)
               if unicodedata.category(chr(code)) in UNSAFE_CATEGORIES and chr(code) not in _KEPT}
    return written, re.compile("[" + "".join(re.escape(chr(code)) for code in written) + "]")


def visible(text: str) -> str:
    """``text`` with each character of :data:`UNSAFE_CATEGORIES` (a control character, DEL, a C1 control,
    a bidi override or isolate, a zero-width or other format character, a lone surrogate, a line or
    paragraph separator) written out as Python writes it in a string (``\\x1b``, ``\\r``, ``\\u202e``,
    ``\\u200b``); a line feed and a tab stay. Part of :func:`outward_text`, which every outgoing text goes through."""
    if text.isascii():
        return text.translate(_ASCII_WRITTEN) if _ASCII_UNSAFE.search(text) else text
    written, unsafe = _unsafe()
    return text.translate(written) if unsafe.search(text) else text


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


#: The longest key whose answer is kept (:func:`secret_key`'s cache): a longer one is read each time,
#: so the cache never holds more than 4096 short keys (a text of huge keys cannot fill the memory).
_CACHED_KEY = 64


def secret_key(key: str) -> bool:
    """Whether ``key`` (of a ``key=value`` or ``"key": value`` pair) names a secret: split into words
    (``camelCase``, ``snake_case``, ``kebab-case``, dots; or at its separators only, whatever its case),
    it holds a word of :data:`SECRET_WORDS`, or its words run together hold a stem of
    :data:`SECRET_STEMS` (``auth`` not counted inside ``author``)."""
    return _secret_key(key) if len(key) <= _CACHED_KEY else _names_secret(key)


@functools.lru_cache(maxsize=4096)
def _secret_key(key: str) -> bool:
    return _names_secret(key)


def _names_secret(key: str) -> bool:
    words = [w.lower() for w in _WORDS.findall(key)]
    if any(w in SECRET_WORDS for w in (*words, *_SEPARATED.split(key.lower()))):  # userPw, pW
        return True
    joined = _NOT_AUTH.sub("", "".join(words))
    return any(stem in joined for stem in SECRET_STEMS)


# -- the passes -------------------------------------------------------------------------------------

# Each starts only where a run of its characters starts (the look-behinds): linear in the text's length,
# a 10 MB message included (without them, a long run of letters took quadratic time).
_URL_IN_TEXT = re.compile(r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*://\S+")
#: What ends a sentence or closes a bracket after a URL, and is not part of it.
_URL_TAIL = "'\")]}>.,;:!"

#: ``user:password@`` with no scheme before it: a user (no ``/``, ``@`` or ``:``), a password (no ``@``),
#: from where a word starts. What may stand before the user and stays (``dsn=``, ``//``, ``(``) is cut
#: off by :func:`_userinfo`.
_WORD_EDGE = "\\s'\"<>()\\[\\]{}`"
_USERINFO = re.compile(rf"(?<![^{_WORD_EDGE}])(?://)?[^{_WORD_EDGE}/@:]*:(?!//)[^{_WORD_EDGE}@]*@(?=[^{_WORD_EDGE}@])")
_REST_OF_WORD = re.compile(rf"[^{_WORD_EDGE}]*")

#: A key, its closing quote (escaped as in a JSON text inside a string: ``\\"password\\": ...``), a
#: separator (``=``, ``:``, ``=>``, ``:=``).
_PAIR_IN_TEXT = re.compile(r"(?<![A-Za-z0-9_.-])([A-Za-z0-9_.-]+)(?:\\*[\'\"])?[ \t]*[=:]+>?[ \t]*")
#: A run of a value written without quotes: to a space, a quote, ``,``, ``;`` or ``&``.
_PAIR_VALUE = re.compile(r"[^\s\'\",;&]*")
_TO_QUOTE = {"'": re.compile(r"[^'\n]*"), '"': re.compile(r'[^"\n]*')}
_TO_BRACKET = re.compile(r"[^{}\[\]()\'\"\n]*")
_OPENS, _CLOSES = "{[(", "}])"
#: What may follow a key with no value on its line: nothing, or a YAML block scalar's indicator.
_BLOCK_START = re.compile(r"(?:[|>][-+0-9]*[ \t]*)?(?=(?:\\r)?\n)")
_INDENT = re.compile(r"[ \t]*")
#: A value that is itself the next pair's key, a header's (``Authorization: token: ...``): left for
#: that pair when its key names a secret too.
_KEY_AHEAD = re.compile(r"([A-Za-z0-9_.-]+)[ \t]*:[ \t]+")
#: An HTTP authorization scheme, whose credentials follow it (``Bearer x``, ``Basic x``).
_SCHEME = re.compile(r"(?:bearer|basic|digest|token|negotiate|ntlm|hmac|apikey|aws4-hmac-sha256)[ \t]+", re.IGNORECASE)
_LINE_END = re.compile(r"[^\n]*")
#: Credentials written as parameters after their scheme (``Digest username="u", response="..."``),
#: not one token (``Basic dXM6cHc=``): all of them, to the end of the line.
_AUTH_PARAM = re.compile(r"[A-Za-z0-9_-]+=(?=[\"A-Za-z0-9])")
_BEARER = re.compile(r"(?<![A-Za-z0-9_-])(bearer[ \t]+)[^\s\'\",;&]+", re.IGNORECASE)
#: A PEM block whose label names a private key (``RSA PRIVATE KEY``, ``ENCRYPTED PRIVATE KEY``,
#: ``PGP PRIVATE KEY BLOCK``, ``OPENSSH PRIVATE KEY``): by the word ``PRIVATE`` in its label.
_PEM = re.compile(r"-----BEGIN ([A-Z0-9 ]*)-----")


def _urls(text: str) -> str:
    def url(match: re.Match[str]) -> str:
        token = match.group(0)
        end = len(token.rstrip(_URL_TAIL))  # linear (a regex searching for a run at the end is quadratic)
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


def _closing(text: str, at: int, quote: str, escapes: int) -> tuple[int, int]:
    """Where a quoted text opened before ``at`` by ``quote`` after ``escapes`` backslashes ends: its
    closing quote's start and end. The closing quote is the first one after no more backslashes than
    the opening one (``\\"...\\"`` in a JSON text inside a string; ``\\\\\\"`` inside it is content), or, after
    none, after an even number of them; none on the line: the line's end (masked to there)."""
    pos = at
    while True:
        end = _TO_QUOTE[quote].match(text, pos).end()  # type: ignore[union-attr]
        if end == len(text) or text[end] == "\n":
            return end, end
        run = _escapes(text, pos, end)
        if run <= escapes or (escapes == 0 and run % 2 == 0):
            return end - min(run, escapes), end + 1
        pos = end + 1


def _escapes(text: str, start: int, at: int) -> int:
    """How many backslashes stand right before ``at``, none of them before ``start``."""
    return at - len(text[start:at].rstrip("\\")) - start


def _bracketed(text: str, at: int) -> int:
    """The end of the bracketed value opening at ``at`` (``{"password": {"value": "x"}}``,
    ``(a b)``): to the bracket that closes it, quoted texts skipped, over lines (a JSON printed over
    many); none: the text's end."""
    depth, pos = 0, at
    while pos < len(text):
        segment = pos
        pos = _TO_BRACKET.match(text, pos).end()  # type: ignore[union-attr]
        if pos == len(text):
            break
        char = text[pos]
        if char in _OPENS:
            depth += 1
        elif char in _CLOSES:
            depth -= 1
            if depth == 0:
                return pos + 1
        elif char in "'\"":
            pos = _closing(text, pos + 1, char, _escapes(text, segment, pos))[1] - 1
        pos += 1
    return len(text)


def _block(text: str, key_start: int, at: int) -> int:
    """The end of the lines after ``at`` indented deeper than the line of the key at ``key_start`` (a
    YAML value on the lines after its key: ``password:\\n  s3cret``, ``secret: |\\n  ...``); none: ``at``."""
    line = text.rfind("\n", 0, key_start) + 1
    indent = _INDENT.match(text, line).end() - line  # type: ignore[union-attr]
    end = at + 2 if text.startswith("\\r", at) else at  # a carriage return, written out
    while end < len(text) and text[end] == "\n":
        deeper = _INDENT.match(text, end + 1).end()  # type: ignore[union-attr]
        if deeper - end - 1 <= indent or deeper == len(text) or text[deeper] == "\n":
            break
        end = _LINE_END.match(text, deeper).end()  # type: ignore[union-attr]
    return end


def _value(text: str, at: int) -> tuple[int, int, int]:
    """The value written at ``at``: where the mask starts, where it ends, and where the value ends.
    A run written without quotes (to a space, a quote, ``,``, ``;`` or ``&``) and the quoted texts that
    follow it (``b's3 cret'``, ``E'a b'``, ``'it''s'``); a value that is one quoted text keeps its quotes
    (``"***"``); a bracketed one to its closing bracket."""
    if at < len(text) and text[at] in _OPENS:
        end = _bracketed(text, at)
        return at, end, end
    pos = _PAIR_VALUE.match(text, at).end()  # type: ignore[union-attr]
    quoted, segment = None, at
    while pos < len(text) and text[pos] in "'\"":  # a quoted text, or quoted texts run together (``'it''s'``)
        escapes = _escapes(text, segment, pos)
        close_start, close_end = _closing(text, pos + 1, text[pos], escapes)
        if pos - escapes == at:  # the value opens with this quote
            quoted = (pos + 1, close_start, close_end)
        pos = segment = close_end
    if quoted is not None and quoted[2] == pos:  # one quoted text: its quotes stay
        return quoted[0], quoted[1], pos
    return at, pos, pos


def _pairs(text: str) -> str:
    """The value of each pair whose key names a secret (:func:`secret_key`) as ``***`` (:func:`_value`):
    a quoted one to its closing quote, an unquoted one to a space, a quote, ``,``, ``;`` or ``&``, a
    bracketed one to its closing bracket; after an authorization scheme (``Authorization: Bearer x``),
    its token, the scheme kept, or its parameters to the end of the line (``Digest username="u", ...``); a cookie's, to the end of its line; one written on the lines
    after its key, indented deeper (YAML), those lines."""
    out: list[str] = []
    at = 0
    while (match := _PAIR_IN_TEXT.search(text, at)) is not None:
        out.append(text[at:match.end()])
        at = match.end()
        key = match.group(1)
        if not secret_key(key):
            continue
        if (ahead := _KEY_AHEAD.match(text, at)) is not None and secret_key(ahead.group(1)):
            continue  # its value is the next pair (``Authorization: token: x``)
        scheme = _SCHEME.match(text, at) if "auth" in key.lower() else None
        if scheme is not None:
            out.append(scheme.group(0))
            at = scheme.end()
        if (scheme is not None and _AUTH_PARAM.match(text, at)) or "cookie" in key.lower():
            start = at
            end = stop = _LINE_END.match(text, at).end()  # type: ignore[union-attr]
        elif (block := _BLOCK_START.match(text, at)) is not None:
            start = block.end()
            end = stop = _block(text, match.start(), block.end())
        else:
            start, end, stop = _value(text, at)
        if end > start:
            out.append(text[at:start] + MASK + text[end:stop])
            at = stop
    return "".join(out) + text[at:] if out else text


def _private_keys(text: str) -> str:
    """Each PEM private key block's body as ``***`` (to its END line, else to the end of the text)."""
    out: list[str] = []
    at = 0
    while (match := _PEM.search(text, at)) is not None:
        if "PRIVATE" not in match.group(1):
            out.append(text[at:match.end()])
            at = match.end()
            continue
        end_line = f"-----END {match.group(1)}-----"
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


def outward_traceback(exc: BaseException, limit: int | None = None) -> str:
    """An error's traceback (its causes included) through :func:`outward_text`: what a log line says in
    place of ``exc_info=True``, which sends the error's text and every frame's source line as they are."""
    try:
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    except Exception:  # a message that cannot be read
        text = f"{type(exc).__name__}: <its message could not be read>"
    return outward_text(text, limit)
