"""`InFlightWords`: what a face calls its first-ready verbs, for every message about them.

gymnasium's and pfrl's faces expose envpool's ``send`` and ``recv``; Tianshou's has one ``step``
that sends and collects, and ``step(None)`` that only collects. The engine's checks of the calls
in flight (`CallState`) and its waits (`FirstReadyVerbs`) speak in the face's words, given once
at `Engine.start`, so a user reads only verbs they call and no face words a check twice.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SEND_RECV", "InFlightWords"]


@dataclass(frozen=True)
class InFlightWords:
    """A face's words for its first-ready calls (the defaults: ``send``/``recv``).

    The templates are `str.format`-ted with the fields each one names.
    """

    #: The verb that puts envs in flight: errors of a send name it.
    send: str = "send"
    #: The verb that collects them: its errors and timeouts name it.
    recv: str = "recv"
    #: A send refused: env ``{env}`` has a call (a step or a reset) still in flight.
    busy_send: str = (
        "env {env} already has a call in flight; `recv` its result before sending it another "
        "action."
    )
    #: A reset refused: env ``{env}`` has a call (a step or a reset) still in flight.
    busy_reset: str = (
        "env {env} already has a call in flight; `recv` its result before resetting it."
    )
    #: A call ``{verb}`` refused while the envs ``{envs}`` have first-ready calls in flight (any
    #: verb that may not run beside them: a full reset, Tianshou's `seed` or `render`...).
    busy_all: str = (
        "`{verb}` was called while env(s) {envs} have calls in flight; `recv` them first."
    )
    #: A collect with nothing in flight.
    nothing: str = (
        "`recv` was called with nothing in flight; `send` actions (or `async_reset`) first."
    )
    #: How the user waits longer for the envs a timeout leaves in flight.
    again: str = "call `recv` again to wait longer"


#: envpool's words, which gymnasium's and pfrl's faces use.
SEND_RECV = InFlightWords()
