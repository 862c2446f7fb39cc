"""A small S3 client for what reading a store asks: list a folder, get an object or a range of it.

A process that reads a store through s3fs first imports it (aiobotocore, aiohttp, httpx: ~1 s) and makes
a botocore session (service models, endpoint rules: ~0.4 s) before its first request; a ``tracedag
query`` on a store that is cached locally spends most of its time there. These reads need three
requests (ListObjectsV2, GetObject, HeadObject), signed with AWS Signature Version 4, so they are made
here with the standard library, one keep-alive connection per thread (and ``put``, the one small object a
reader keeps for the others: ``freshkept``). s3fs still does every write of tables and manifests, and
all the reads when the credentials are not plain keys in the environment (profiles, roles, SSO: botocore's
chain resolves those) or ``TRACEDAG_S3_CLIENT=s3fs`` asks for it.

Settings (the AWS variables botocore reads): ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_SESSION_TOKEN``; ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` (a server that is not AWS: path-style
URLs); else ``AWS_REGION`` / ``AWS_DEFAULT_REGION`` (virtual-hosted URLs on amazonaws.com); ``AWS_CA_BUNDLE``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import http.client
import os
import ssl
import threading
import time
import urllib.parse
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Any

CLIENT = "TRACEDAG_S3_CLIENT"
"""``s3fs``: make every request through s3fs (this client is not used)."""
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
TIMEOUT = 60.0
CONNECT_TIMEOUT = 5.0
ATTEMPTS = 3
_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"


class ObjectChanged(OSError):
    """The object's ETag is no longer the one listed (412): it was replaced since the listing."""


@dataclass(frozen=True)
class Credentials:
    """Static keys (and a session token) from the environment."""

    key: str
    secret: str
    token: str = ""


@dataclass
class S3Lite:
    """Reads from one S3 endpoint: ``ls``, ``cat_file`` (a range, optionally only of a given ETag), ``exists``."""

    endpoint: str  # https://host[:port] (path-style) or "" for AWS (virtual-hosted per bucket)
    region: str
    creds: Credentials
    _local: threading.local = field(default_factory=threading.local, repr=False)

    @classmethod
    def from_env(cls, protocol: str = "s3") -> S3Lite | None:
        """The client the environment allows, or None (s3fs then does everything)."""
        if protocol not in ("s3", "s3a") or os.environ.get(CLIENT, "").lower() == "s3fs":
            return None
        key, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or ""
        if not key or not secret or not (endpoint or region):
            return None
        creds = Credentials(key, secret, os.environ.get("AWS_SESSION_TOKEN", ""))
        return cls(endpoint.rstrip("/"), region or "us-east-1", creds)

    # ------------------------------------------------------------ fsspec-like reads

    def ls(self, path: str, detail: bool = True) -> list[Any]:
        """The objects and folders directly under ``bucket/prefix`` (s3fs's ``ls``); FileNotFoundError when none."""
        bucket, _, prefix = path.strip("/").partition("/")
        rows: list[dict[str, Any]] = []
        token = ""
        while True:
            query = {"list-type": "2", "delimiter": "/", "prefix": f"{prefix}/" if prefix else ""}
            if token:
                query["continuation-token"] = token
            root = ET.fromstring(self._request("GET", bucket, "", query).body)
            rows += _rows(bucket, root)
            token = _text(root, "NextContinuationToken")
            if _text(root, "IsTruncated") != "true" or not token:
                break
        if not rows and prefix:
            raise FileNotFoundError(path)
        return rows if detail else [r["name"] for r in rows]

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, etag: str | None = None) -> bytes:
        """The bytes of an object, or of ``[start, end)``; with ``etag``, only of that version (else ObjectChanged)."""
        bucket, _, key = path.strip("/").partition("/")
        headers = {}
        if start is not None or end is not None:
            headers["range"] = f"bytes={start or 0}-{'' if end is None else end - 1}"
        if etag:
            headers["if-match"] = etag
        return self._request("GET", bucket, key, {}, headers).body

    def put(self, path: str, body: bytes) -> None:
        """Write ``body`` as the object ``bucket/key`` (one PUT: atomic; small objects, as ``materialized`` keeps)."""
        bucket, _, key = path.strip("/").partition("/")
        self._request("PUT", bucket, key, {}, body=body)

    def exists(self, path: str) -> bool:
        """Whether ``bucket/key`` is an object or a folder with objects under it."""
        bucket, _, key = path.strip("/").partition("/")
        query = {"list-type": "2", "max-keys": "1", "prefix": f"{key}/" if key else ""}
        root = ET.fromstring(self._request("GET", bucket, "", query).body)
        if root.find(f"{_NS}Contents") is not None or not key:
            return True
        try:
            self._request("HEAD", bucket, key, {})
            return True
        except FileNotFoundError:
            return False

    # ------------------------------------------------------------ requests

    def _request(self, method: str, bucket: str, key: str, query: dict[str, str],
                 headers: dict[str, str] | None = None, body: bytes = b"") -> _Response:
        host, path = self._where(bucket, key)
        for attempt in range(1, ATTEMPTS + 1):
            try:
                found = self._once(method, host, path, query, dict(headers or {}), body)
            except (ConnectionError, http.client.HTTPException, TimeoutError) as e:
                self._drop(host)
                if attempt == ATTEMPTS:
                    raise OSError(f"s3 {method} {bucket}/{key}: {type(e).__name__}: {e}") from e
                time.sleep(0.05 * attempt)
                continue
            if found.status >= 500 and attempt < ATTEMPTS:  # 500, 503 SlowDown: again, a little later
                time.sleep(0.1 * attempt)
                continue
            return _checked(found, method, f"{bucket}/{key}")
        raise AssertionError("unreachable")

    def _where(self, bucket: str, key: str) -> tuple[str, str]:
        """(https://host, /path) of an object: path-style on a given endpoint, virtual-hosted on AWS."""
        quoted = urllib.parse.quote(key, safe="/-_.~")
        if self.endpoint:
            return self.endpoint, f"/{bucket}/{quoted}"
        if "." in bucket:  # not a valid TLS host name label: path-style
            return f"https://s3.{self.region}.amazonaws.com", f"/{bucket}/{quoted}"
        return f"https://{bucket}.s3.{self.region}.amazonaws.com", f"/{quoted}"

    def _once(self, method: str, base: str, path: str, query: dict[str, str], headers: dict[str, str],
              body: bytes = b"") -> _Response:
        url = urllib.parse.urlsplit(base)
        qs = "&".join(f"{_q(k)}={_q(v)}" for k, v in sorted(query.items()))
        payload = hashlib.sha256(body).hexdigest() if body else EMPTY_SHA256
        headers.update(sign(self.creds, self.region, method, url.netloc, path, qs, headers, payload=payload))
        con = self._connection(base)
        con.request(method, path + (f"?{qs}" if qs else ""), body=body or None, headers=headers)
        resp = con.getresponse()
        body = resp.read()
        return _Response(resp.status, body, resp.getheader("ETag", ""))

    def _connection(self, base: str) -> http.client.HTTPConnection:
        pool: dict[str, http.client.HTTPConnection] = self._local.__dict__.setdefault("pool", {})
        con = pool.get(base)
        if con is None:
            url = urllib.parse.urlsplit(base)
            if url.scheme == "https":
                context = ssl.create_default_context(cafile=os.environ.get("AWS_CA_BUNDLE") or None)
                con = http.client.HTTPSConnection(url.netloc, timeout=CONNECT_TIMEOUT, context=context)
            else:
                con = http.client.HTTPConnection(url.netloc, timeout=CONNECT_TIMEOUT)
            con.connect()  # a dead endpoint fails in seconds; then reads may take up to TIMEOUT
            con.timeout = TIMEOUT
            if con.sock is not None:
                con.sock.settimeout(TIMEOUT)
            pool[base] = con
        return con

    def _drop(self, base: str) -> None:
        """Close a connection the server closed or broke (kept-alive connections go stale)."""
        con = self._local.__dict__.get("pool", {}).pop(base, None)
        if con is not None:
            con.close()


@dataclass(frozen=True)
class _Response:
    status: int
    body: bytes
    etag: str


def _checked(resp: _Response, method: str, what: str) -> _Response:
    """The response when it is a success; else the error S3 means (FileNotFoundError, PermissionError, ...)."""
    if resp.status < 300:
        return resp
    code, message = _error(resp.body)
    text = f"s3 {method} {what}: {resp.status} {code}: {message}".rstrip(": ")
    if resp.status == 404:
        raise FileNotFoundError(text)
    if resp.status == 403:
        raise PermissionError(text)
    if resp.status == 412:
        raise ObjectChanged(text)
    raise OSError(text)


def _error(body: bytes) -> tuple[str, str]:
    """(Code, Message) of an S3 error body (empty for HEAD)."""
    try:
        root = ET.fromstring(body)
    except ET.ParseError:
        return "", body[:200].decode(errors="replace")
    return (root.findtext("Code") or ""), (root.findtext("Message") or "")


def _text(root: ET.Element, tag: str) -> str:
    return root.findtext(f"{_NS}{tag}") or ""


def _rows(bucket: str, root: ET.Element) -> list[dict[str, Any]]:
    """ListObjectsV2 rows as s3fs gives them: files (name, size, ETag, LastModified) and folders."""
    rows: list[dict[str, Any]] = []
    for item in root.iter(f"{_NS}Contents"):
        key = _text(item, "Key")
        if key.endswith("/"):  # a folder marker object
            continue
        modified = dt.datetime.fromisoformat(_text(item, "LastModified").replace("Z", "+00:00"))
        rows.append({"name": f"{bucket}/{key}", "Key": key, "size": int(_text(item, "Size") or 0), "type": "file",
                     "ETag": _text(item, "ETag"), "LastModified": modified})
    for item in root.iter(f"{_NS}CommonPrefixes"):
        rows.append({"name": f"{bucket}/{_text(item, 'Prefix').rstrip('/')}", "size": 0, "type": "directory"})
    return rows


def _q(text: str) -> str:
    """RFC 3986 encoding, as SigV4's canonical query string wants it."""
    return urllib.parse.quote(text, safe="-_.~")


def sign(creds: Credentials, region: str, method: str, host: str, path: str, query: str,
         headers: dict[str, str], now: dt.datetime | None = None, payload: str = EMPTY_SHA256) -> dict[str, str]:
    """The headers that sign a request with AWS Signature Version 4 for S3 (``Authorization`` and the rest).

    ``path`` is already URI-encoded (S3 does not encode it twice) and ``query`` canonical (sorted, encoded);
    ``payload``: the SHA-256 of the request's body (hex).
    """
    when = now or dt.datetime.now(dt.UTC)
    stamp, day = when.strftime("%Y%m%dT%H%M%SZ"), when.strftime("%Y%m%d")
    signed = {k.lower(): str(v).strip() for k, v in headers.items()}
    signed.update({"host": host, "x-amz-date": stamp, "x-amz-content-sha256": payload})
    if creds.token:
        signed["x-amz-security-token"] = creds.token
    names = sorted(signed)
    canonical = "\n".join([method, path, query, *(f"{n}:{signed[n]}" for n in names), "",
                           ";".join(names), payload])
    scope = f"{day}/{region}/s3/aws4_request"
    to_sign = f"AWS4-HMAC-SHA256\n{stamp}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
    key = f"AWS4{creds.secret}".encode()
    for part in (day, region, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    out = {k: v for k, v in signed.items() if k.startswith("x-amz-")}
    out["Authorization"] = (f"AWS4-HMAC-SHA256 Credential={creds.key}/{scope}, "
                            f"SignedHeaders={';'.join(names)}, Signature={signature}")
    return out
