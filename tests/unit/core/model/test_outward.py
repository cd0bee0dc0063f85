"""The one sanitizer of outgoing texts (core/model/outward.py): credentials in every common spelling
never come out, control characters never come out raw, and a huge text takes linear time. No Airflow."""

from __future__ import annotations

import re
import string
import sys
import time
import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_resumable.core.model import outward
from airflow_resumable.core.model.outward import MASK, outward_text, secret_key, visible

_SETTINGS = settings(max_examples=600, deadline=None, database=None,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

#: What may not come out raw, by Unicode category: controls (C0 but a line feed and a tab, DEL, C1),
#: format characters (bidi marks/overrides/isolates, zero-width spaces and joiners, the soft hyphen,
#: the byte order mark, tag characters), lone surrogates, line and paragraph separators.
UNSAFE_CHARS = [chr(c) for c in range(sys.maxunicode + 1)
                if unicodedata.category(chr(c)) in ("Cc", "Cf", "Cs", "Zl", "Zp") and chr(c) not in "\n\t"]
UNSAFE = re.compile("[" + "".join(re.escape(c) for c in UNSAFE_CHARS) + "]")


# -- the forms, one by one -------------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    # the forms the first scrubber kept
    "pass=s3cr3t-Value", "passphrase=s3cr3t-Value", "pw=s3cr3t-Value", "private_key=s3cr3t-Value",
    "auth=s3cr3t-Value", "could not connect to alice:s3cr3t-Value@db.internal:5432/loans",
    # every key spelling, every separator
    "password=s3cr3t-Value", "PASSWORD = s3cr3t-Value", "passwd: s3cr3t-Value", "pwd=s3cr3t-Value",
    "PGPASSWORD=s3cr3t-Value", "MYSQL_PWD=s3cr3t-Value", "secret=s3cr3t-Value", "client_secret=s3cr3t-Value",
    "clientSecret: s3cr3t-Value", "token=s3cr3t-Value", "access_token=s3cr3t-Value", "refreshToken=s3cr3t-Value",
    "api_key=s3cr3t-Value", "apikey=s3cr3t-Value", "api-key: s3cr3t-Value", "X-Api-Key: s3cr3t-Value",
    "privateKey=s3cr3t-Value", "authorization=s3cr3t-Value", "credential=s3cr3t-Value",
    "credentials: s3cr3t-Value", "sessionid=s3cr3t-Value", "session_token=s3cr3t-Value",
    "aws_secret_access_key=s3cr3t-Value", "x-auth-token: s3cr3t-Value", "--password=s3cr3t-Value",
    # quoted, JSON, Python reprs
    '{"password": "s3cr3t-Value"}', '{"password":"s3cr3t-Value"}', "{'pw': 's3cr3t-Value'}",
    "password='s3cr3t Value with spaces'", 'token="s3cr3t-Value \\" still the value"',
    # DSN-style
    "dsn='host=db port=5432 user=alice password=s3cr3t-Value dbname=x'",
    # URLs with and without a scheme
    "postgresql://alice:s3cr3t-Value@db:5432/x", "//alice:s3cr3t-Value@db/x", "dsn=alice:s3cr3t-Value@db",
    "(alice:s3cr3t-Value@db)", "s3://AKIAX:s3cr3t/Value@bucket/k", "https://host/p?sig=s3cr3t-Value&x=1",
    # headers
    "Authorization: Bearer s3cr3t-Value", "authorization: basic s3cr3t-Value", "sent Bearer s3cr3t-Value",
    "Authorization: token: s3cr3t-Value", "Cookie: theme=dark; sid=s3cr3t-Value",
    # a PEM private key
    "key: -----BEGIN RSA PRIVATE KEY-----\nMIIEs3cr3t-Value\n-----END RSA PRIVATE KEY-----",
])
def test_each_credential_form_loses_its_secret_and_keeps_its_key(text: str) -> None:
    out = outward_text(f"error before; {text} ; after")
    assert "s3cr3t" not in out and "Value" not in out, out
    assert out.startswith("error before; ")  # the text around it stays (a cookie's value is its whole line)
    assert out.endswith(" ; after") or text.startswith("Cookie")
    assert MASK in out or "://" in text  # a URL with a scheme loses its userinfo and query whole


@pytest.mark.parametrize("text", [
    "password authentication failed for user alice", "user=alice host=db port=5432 dbname=loans",
    "key=['id'] has ties", "author=Ann", "authority=login.example", "s3://bucket/v@2.csv",
    "mail alice@example.com", "owner ti-1/try2@worker-3:1234", "slot=2026-03-01T10:00:00+00:00",
    "the lease [job='a.b' slot='2026-03-01T10:00:00+00:00'] is lost", "processed=10 total=30 rate=2.5",
    "line one\n\tline two",
])
def test_a_text_without_credentials_or_control_characters_comes_out_as_it_is(text: str) -> None:
    assert outward_text(text) == text


@pytest.mark.parametrize("key", [
    "pass", "passwd", "password", "passphrase", "pw", "pwd", "secret", "client_secret", "token", "access_token",
    "refresh_token", "api_key", "apikey", "api-key", "private_key", "auth", "authorization", "credential",
    "credentials", "session", "cookie", "PGPASSWORD", "userPassword", "X-Auth-Token", "AWS_SECRET_ACCESS_KEY",
    "jwt", "sas_signature", "accountKey", "PIN", "Pw", "pW",
])
def test_a_key_naming_a_secret_is_one_by_its_words_in_any_spelling(key: str) -> None:
    assert secret_key(key) and secret_key(key.upper()) and secret_key(key.lower())


@pytest.mark.parametrize("key", ["user", "login", "host", "key", "job", "slot", "author", "authority", "keyset",
                                 "position", "processed", "spin", "sigma", "opinion"])
def test_a_key_naming_no_secret_keeps_its_value(key: str) -> None:
    assert not secret_key(key)


def test_control_characters_and_escape_sequences_are_written_out_a_line_feed_and_a_tab_stay() -> None:
    text = "by \x1b]0;pwned\x07\x1b[2J and \u202eevil\u2066 \r\x00\x7f\x9b\u2028 end\n\tnext"
    out = outward_text(text)
    assert out == ("by \\x1b]0;pwned\\x07\\x1b[2J and \\u202eevil\\u2066 \\r\\x00\\x7f\\x9b\\u2028 end\n\tnext")
    assert not UNSAFE.search(out) and visible(out) == out


# -- generated: secrets in generated wrappers, control characters ------------------------------------

KEYS = ["pass", "passwd", "password", "passphrase", "pw", "pwd", "secret", "client_secret", "clientSecret",
        "token", "access_token", "refresh_token", "refreshToken", "api_key", "apikey", "api-key", "apiKey",
        "private_key", "privateKey", "auth", "authorization", "credential", "credentials", "session",
        "session_id", "cookie", "PGPASSWORD", "aws_secret_access_key", "X-Api-Key", "x-auth-token", "db_password"]
FILLER = ["error", "while", "connecting", "to", "the", "database", "failed:", "retrying", "(", ")", "[", "]",
          ";", ",", "\n", "\t", "at", "line", "42", "{", "}", "host=db", "port=5432", "user=alice", "->", "'x'"]
#: A value written without quotes ends at a space, a quote, ``,``, ``;`` or ``&``: anything else may be in it.
UNQUOTED = string.ascii_letters + string.digits + "-_.~+/!$%*^()[]{}|:?#=<>@"
#: A quoted value ends at its closing quote (a backslash escapes the next character).
QUOTED = UNQUOTED + " ,;&"
#: What a URL's password may hold (RFC 3986's unreserved, sub-delimiters but quotes and brackets, ``:``, ``%``).
USERINFO = string.ascii_letters + string.digits + "-._~!$*+,;=:%"
BEARER = string.ascii_letters + string.digits + "-._~+/="


def _random_case(draw: st.DrawFn, text: str) -> str:
    return "".join(c.upper() if draw(st.booleans()) else c.lower() for c in text)


@st.composite
def wrapped_secrets(draw: st.DrawFn) -> tuple[str, str, str]:
    """A secret in one wrapper, inside longer text: (the text, the secret, the text without the secret)."""
    form = draw(st.sampled_from(["pair", "quoted", "json", "url", "bare_userinfo", "bearer", "basic"]))
    if form in ("pair", "quoted", "json"):
        key = _random_case(draw, draw(st.sampled_from(KEYS)))
        if form == "pair":
            secret = draw(st.text(UNQUOTED, min_size=8, max_size=24))
            sep = draw(st.sampled_from(["=", ": ", ":", " = ", "= ", "=\t"]))
            wrapper = f"{key}{sep}{{}}"
        else:
            secret = draw(st.text(QUOTED, min_size=8, max_size=24))
            quote = draw(st.sampled_from(["'", '"']))
            secret = secret.replace(quote, "").replace("\\", "") or "q" * 8
            if form == "json":
                sep = draw(st.sampled_from([": ", ":"]))
                wrapper = f"{quote}{key}{quote}{sep}{quote}{{}}{quote}"
            else:
                sep = draw(st.sampled_from(["=", ": ", " = "]))
                wrapper = f"{key}{sep}{quote}{{}}{quote}"
    elif form == "url":
        secret = draw(st.text(USERINFO + "/", min_size=8, max_size=24))
        scheme = draw(st.sampled_from(["postgresql", "mysql", "https", "s3", "redis", "amqp"]))
        wrapper = f"{scheme}://alice:{{}}@db.internal:5432/loans"
    elif form == "bare_userinfo":
        secret = draw(st.text(USERINFO, min_size=8, max_size=24))
        wrapper = draw(st.sampled_from(["alice:{}@db.internal:5432/loans", "//alice:{}@db.internal/loans",
                                        "dsn=alice:{}@db", "(alice:{}@db.internal)"]))
    else:
        secret = draw(st.text(BEARER, min_size=8, max_size=40))
        scheme = "Bearer" if form == "bearer" else "Basic"
        wrapper = draw(st.sampled_from([f"Authorization: {scheme} {{}}", f"authorization: {scheme.lower()} {{}}"]
                                       + ([f"{scheme} {{}}"] if form == "bearer" else [])))
    before = " ".join(draw(st.lists(st.sampled_from(FILLER), max_size=6)))
    after = " ".join(draw(st.lists(st.sampled_from(FILLER), max_size=6)))
    text = f"{before} {wrapper.format(secret)} {after}"
    return text, secret, f"{before} {wrapper.format('')} {after}"


@_SETTINGS
@given(wrapped_secrets())
def test_a_generated_secret_in_a_generated_wrapper_never_comes_out(case: tuple[str, str, str]) -> None:
    text, secret, template = case
    out = outward_text(text)
    # No run of 6 characters of the secret is left, unless the text around it holds that run too.
    width = min(6, len(secret))
    leaked = {secret[i:i + width] for i in range(len(secret) - width + 1)} - {
        w for w in (secret[i:i + width] for i in range(len(secret) - width + 1)) if w in template or w in MASK}
    assert not [w for w in leaked if w in out], (text, out)


@_SETTINGS
@given(st.lists(st.one_of(st.sampled_from(UNSAFE_CHARS), st.text(string.printable, max_size=8),
                          st.sampled_from(["\x1b[2J", "\x1b]0;pwned\x07", "\x9b31m", "password=\x1b[8m"])),
                max_size=40))
def test_a_generated_control_character_never_comes_out_raw(parts: list[str]) -> None:
    out = outward_text("".join(parts))
    assert not UNSAFE.search(out), out


# -- linear time -----------------------------------------------------------------------------------

@pytest.mark.parametrize("unit", ["a", "a:", "x://a:", "password=", "a:b,", "//a:b@x ", "pw: ", "password='",
                                  "Bearer ", "\x1b", "a=a:", "-----BEGIN PRIVATE KEY-----"])
def test_a_ten_megabyte_text_is_sanitized_in_linear_time(unit: str) -> None:
    """Given 10 MB of a pattern that would make a backtracking scrubber quadratic (a run of letters, of
    ``a:`` pairs, of URL-like words, of keys without values, of userinfo-like words...), When it is
    sanitized, Then it takes seconds (quadratic time would be hours)."""
    text = unit * (10_000_000 // len(unit))
    began = time.monotonic()
    outward_text(text)
    assert time.monotonic() - began < 30, unit


def test_a_limit_reads_only_the_start_and_never_leaves_half_of_a_userinfo() -> None:
    text = "error " * 100 + "alice:hunter2@db.internal/x failed"
    for limit in range(590, 640):
        cut = outward_text(text, limit)
        assert len(cut) <= limit and "hunter" not in cut and "alice" not in cut, limit


# -- forms read as the parsers that meet them read them ------------------------------------------

@pytest.mark.parametrize("text", [
    # a libpq URI: its password runs to the @ before the first /, a # or a ? included (urlsplit's fragment)
    "postgresql://alice:s3cr3t#Value@db:5432/x", "postgresql://alice:s3cr3t?Value@db/x",
    "postgresql://alice:s3cr3t#Value@db",
    # a value that is an object, an array, a bracketed text (JSON, a Python repr)
    '{"password": {"value": "s3cr3t-Value"}}', '{"auth": {"user": "u", "password": "s3cr3t-Value"}}',
    "password=['s3cr3t', 'Value']", "password = (s3cr3t Value)",
    # quoted texts after a prefix or run together: Python bytes and PostgreSQL strings
    "{'password': b's3cr3t-Value'}", "password=b's3cr3t Value'", "password=E's3cr3t Value'",
    "password='s3cr3t''s Value'",
    # a JSON text inside a string, its quotes escaped
    '{"body": "{\\"password\\": \\"s3cr3t Value\\", \\"user\\": \\"u\\"}"}',
    # other separators
    "'password' => 's3cr3t Value'", "password := s3cr3t-Value",
    # an authorization header's credentials as parameters
    'Authorization: Digest username="u", response="s3cr3t", cnonce="Value"',
    # any PEM block whose label says PRIVATE
    "-----BEGIN PGP PRIVATE KEY BLOCK-----\ns3cr3t\nValue\n-----END PGP PRIVATE KEY BLOCK-----",
])
def test_a_secret_in_a_form_real_parsers_read_never_comes_out(text: str) -> None:
    out = outward_text(f"error before; {text} ; after")
    assert "s3cr3t" not in out and "Value" not in out, out
    assert out.startswith("error before; ") and (out.endswith(" ; after") or "Digest" in text), out


def test_a_json_value_printed_over_lines_is_masked_to_its_closing_bracket() -> None:
    text = 'config {\n  "password": {\n    "value": "s3cr3t"\n  },\n  "user": "alice"\n}'
    out = outward_text(text)
    assert "s3cr3t" not in out and '"user": "alice"' in out, out


@pytest.mark.parametrize("text", [
    "db:\n  password:\n    s3cr3t\n    Value\n  user: alice", "db:\n  password: |\n    s3cr3t\n    Value\n  user: alice",
    "db:\r\n  password: >-\r\n    s3cr3t\r\n    Value\r\n  user: alice",
])
def test_a_yaml_value_on_the_lines_after_its_key_is_masked(text: str) -> None:
    out = outward_text(text)
    assert "s3cr3t" not in out and "Value" not in out and "user: alice" in out, out


_LIBPQ_PASSWORD = st.text(string.ascii_letters + string.digits + "-._~!$&'()*+,;=:%#?[]", min_size=8, max_size=24)


@_SETTINGS
@given(_LIBPQ_PASSWORD.filter(lambda p: "%" not in p), st.sampled_from(["postgresql", "postgres"]))
def test_a_uri_password_libpq_reads_never_comes_out(password: str, scheme: str) -> None:
    """Given a URI whose password libpq reads whole (a ``#``, a ``?``, brackets in it), When it is
    sanitized, Then none of that password comes out."""
    from psycopg.conninfo import conninfo_to_dict

    uri = f"{scheme}://alice:{password}@db.internal:5432/loans"
    assert conninfo_to_dict(uri)["password"] == password  # the real parser's reading
    out = outward_text(f"could not connect to {uri}: refused")
    width = min(6, len(password))
    # A piece of the password that is also a piece of the message's own words (``efused``) proves nothing
    words = f"could not connect to {scheme}://alice:***@db.internal:5432/loans: refused"
    pieces = [password[i:i + width] for i in range(len(password) - width + 1)]
    assert not [piece for piece in pieces if piece in out and piece not in words], out


def test_every_character_of_the_unsafe_categories_is_written_out() -> None:
    """A zero-width space or joiner, the soft hyphen, the byte order mark, a tag character, a lone
    surrogate (no UTF-8 encoder takes it: a log handler, a JSON answer, a span exporter would fail)..."""
    text = "".join(UNSAFE_CHARS)
    out = outward_text(text)
    assert not UNSAFE.search(out)
    out.encode("utf-8")
    assert outward_text("admin\u200b \ufeffx\u00ad\U000e0041\ud800") == "admin\\u200b \\ufeffx\\xad\\U000e0041\\ud800"


@pytest.mark.parametrize("text", [
    "x://" + "." * 2_000_000 + "a",  # a run of what ends a URL, not at its end
    "x://h/" + ";" * 2_000_000 + "a",
    "password=" + "''" * 2_000_000, "password={'" * 1_000_000, "password:\n " * 1_000_000,
    '\\"password\\": \\"' * 500_000, "-----BEGIN " + "PRIVATE" * 1_000_000,
])
def test_a_crafted_text_is_sanitized_in_linear_time(text: str) -> None:
    began = time.monotonic()
    outward_text(text)
    assert time.monotonic() - began < 30


def test_huge_keys_do_not_fill_the_key_cache() -> None:
    before = outward._secret_key.cache_info().currsize
    for i in range(50):
        outward_text(f"k{i}" + "x" * 100_000 + "=1")
    assert outward._secret_key.cache_info().currsize == before
