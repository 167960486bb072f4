"""One name for one refusal: a text, a prompt or a request body past its limit is HTTP 413 ``too_large`` on every
route of both services, its ``param`` naming the field and ``details[0].limit`` the limit.

The detector used to answer ``text_too_large``; for one release such an answer also carries the old code in
``details[0].deprecated_code`` and a ``Deprecation`` header (``api.http.deprecated``), so a client matching on the
old code can move at its own pace (docs/reference/vocabulary.md).
"""

from __future__ import annotations

from api.http import TOO_LARGE, ApiError, deprecated


def too_large(field: str, message: str, limit: int, *, formerly: str | None = None) -> ApiError:
    """The 413 for ``field`` past ``limit``; ``formerly`` is the code this route answered before (one release)."""
    detail: dict = {"field": field, "message": message, "limit": limit}
    if formerly is not None:
        detail["deprecated_code"] = formerly
        deprecated(f"error code {formerly} is now {TOO_LARGE}; details[0].deprecated_code keeps the old one "
                   "for one release")
    return ApiError(413, TOO_LARGE, message, details=[detail])
