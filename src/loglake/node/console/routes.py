"""``POST /api/console/decode``: record bytes in, each protocol's decoded fields out.

The record browser reads a range with the streams API (``GET
/api/streams/{stream}/partitions/{p}/records``, data in base64) and, for a decoded view, sends
those same base64 strings here with the format to read them as. Taking bytes rather than a
stream position keeps this route free of the log: it reads nothing, so it cannot be used to
read around the streams API's bounds, and it decodes whatever bytes a caller has. It needs the
bearer token like every ``/api`` route (``node.auth.require_token``).
"""

from __future__ import annotations

import base64
import binascii
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from pydantic import BaseModel, Field

from loglake.errors import DecodeError
from loglake.node.auth import require_token
from loglake.node.console.decode import decode_many

MAX_RECORDS = 1000
"""As many as one range read returns (the streams API's ``limit``)."""
MAX_RECORD_B64 = 6 * 1024 * 1024
"""base64 of the largest single record a range read returns (its 4 MiB page)."""

Format = Literal["waku", "waku-status-go", "sds", "cardinal", "icrc"]


class DecodeRequest(BaseModel):
    format: Format
    records: Annotated[
        list[Annotated[str, Field(max_length=MAX_RECORD_B64)]], Field(max_length=MAX_RECORDS)
    ]
    """Each record's bytes, base64 (as the streams API returns them)."""


class DecodedRecord(BaseModel):
    ok: bool
    type: str | None = None
    """What the record decoded as (``WakuMessage``, ``SdsMessage (content)``, ``BatchMsg``…)."""
    fields: Any = None
    """The decoded fields; bytes as ``{"len", "hex", "text"?}``."""
    error: str | None = None
    """Why the record is not of ``format`` (the codec's reason), when ``ok`` is false."""
    skipped: bool = False
    """Not decoded: the request's budget of values was spent on the records before it."""


class DecodeResponse(BaseModel):
    format: Format
    records: list[DecodedRecord]
    """One a record asked for, in order. Each shows at most ``RECORD_VALUES`` values (lists
    and dicts cut there end with ``{"truncated": N}``, under the key ``"…"`` in a dict),
    and the request ``REQUEST_VALUES`` (``node.console.decode``)."""


class BadBase64(DecodeError):
    """A record in the request is not base64 (→ 400)."""


def _b64(i: int, s: str) -> bytes:
    try:
        return base64.b64decode(s, validate=True)
    except (binascii.Error, ValueError) as e:
        raise BadBase64(f"records[{i}] is not base64: {e}") from e


router = APIRouter(tags=["console"])


@router.post(
    "/console/decode",
    response_model=DecodeResponse,
    summary="Decode records as WakuMessage, SDS, Cardinal or ICRC-72 events (record browser)",
)
def decode(body: DecodeRequest) -> DecodeResponse:
    datas = [_b64(i, s) for i, s in enumerate(body.records)]
    rows = [DecodedRecord(**r) for r in decode_many(body.format, datas)]
    return DecodeResponse(format=body.format, records=rows)


class LoginIn(BaseModel):
    code: str = Field(min_length=1, max_length=200)


class LoginOut(BaseModel):
    token: str


def include(app: FastAPI) -> None:
    """Add the console's API routes under ``/api``, behind the node's bearer token, and
    ``POST /console/login``, open: a one-time code of a link the node printed, traded for
    the token (``auth.LoginCodes``)."""
    app.include_router(router, prefix="/api", dependencies=[Depends(require_token)])

    @app.post("/console/login", include_in_schema=False)
    def login(body: LoginIn, request: Request) -> LoginOut:
        codes = request.app.state.logins
        if codes is None or not codes.redeem(body.code):
            raise HTTPException(
                401,
                "this console link was used already, or is unknown or expired: paste the "
                "token (in <data dir>/node.token)",
            )
        return LoginOut(token=request.app.state.token or "")
