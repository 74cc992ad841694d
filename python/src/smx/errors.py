"""Errors of the smx API: one class per error class the server names."""

from __future__ import annotations

import json
from typing import Dict, Optional, Type


class SmxError(Exception):
    """A refusal or failure answered by `smx serve`."""

    def __init__(self, status: int, klass: str, message: str, exit_code: int = 0) -> None:
        super().__init__(message)
        self.status = status
        self.klass = klass
        self.message = message
        self.exit_code = exit_code


class NotFound(SmxError):
    pass


class Exists(SmxError):
    pass


class Invalid(SmxError):
    pass


class InUse(SmxError):
    pass


class Unavailable(SmxError):
    pass


class Denied(SmxError):
    pass


class FailedPrecondition(SmxError):
    pass


class ExecStartError(FailedPrecondition):
    """A command that could not start: exit_code 127 (not found) or 126."""


_CLASSES: Dict[str, Type[SmxError]] = {
    "not_found": NotFound,
    "exists": Exists,
    "invalid": Invalid,
    "too_large": Invalid,
    "in_use": InUse,
    "unavailable": Unavailable,
    "denied": Denied,
    "failed_precondition": FailedPrecondition,
}


_STATUS: Dict[str, int] = {
    "not_found": 404,
    "exists": 409,
    "in_use": 409,
    "invalid": 400,
    "too_large": 413,
    "unavailable": 503,
    "denied": 403,
    "failed_precondition": 412,
}


def error_from(status: int, body: bytes, klass: Optional[str] = None) -> SmxError:
    """The exception for an error answer (status and JSON body); status 0
    (an error on the exec stream) takes the one the class has over HTTP."""
    message = body.decode("utf-8", "replace").strip()
    exit_code = 0
    try:
        obj = json.loads(body)
        klass = obj.get("class", klass)
        message = obj.get("message", message)
        exit_code = int(obj.get("exit_code", 0) or 0)
    except (ValueError, AttributeError):
        pass
    klass = klass or "internal"
    if not status:
        status = _STATUS.get(klass, 500)
    if exit_code:
        return ExecStartError(status, klass, message, exit_code)
    return _CLASSES.get(klass, SmxError)(status, klass, message, exit_code)
