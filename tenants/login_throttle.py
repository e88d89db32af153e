"""Login throttling for the console and admin logins: password guessing is slowed without handing anyone a way to
lock an account out.

Failures are counted per username *and* client address over a sliding window of ``QUIVER_LOGIN_LOCKOUT_S``
seconds, as django-axes does with ``AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]``
(https://django-axes.readthedocs.io/en/latest/4_configuration.html): an address that guessed wrong
``QUIVER_LOGIN_MAX_FAILURES`` times for a username is refused for that username, and one that failed
``QUIVER_LOGIN_MAX_FAILURES_PER_IP`` times over all usernames is refused for all. Neither limit reaches anyone at
another address, so nobody can lock out an account they do not know the password of (OWASP Authentication Cheat
Sheet, "Account Lockout": lockouts let an attacker deny service to the owner).

An account guessed at from many addresses gets a third limit that still spares its owner: once the username has
``QUIVER_LOGIN_MAX_FAILURES_PER_ACCOUNT`` failures in the window, every address that has itself failed for it is
refused, while an address with no failure for it keeps its attempt. That is OWASP's "Slow Down Online Guessing
Attacks with Device Cookies" rule (lock out the untrusted clients of an account under attack, never the known
ones), with a clean address standing for a known device: a distributed guesser gets one try per fresh address,
the owner at their usual address is never refused.

The address is the one the ASGI server gives (``REMOTE_ADDR``); it comes from ``X-Forwarded-For`` only when the
direct peer is a configured proxy (uvicorn ``--proxy-headers`` with ``FORWARDED_ALLOW_IPS``: compose's edge network,
Kubernetes' ingress; the demo trusts no one), so a client cannot pick it (docs/security.md).
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db.models import QuerySet
from django.utils import timezone

from tenants.models import LoginFailure


class LoginThrottled(Exception):
    """Too many recent failed logins from this address (for this username, or at all), or from this address for an
    account under attack; ``retry_after`` is in whole seconds."""

    def __init__(self, retry_after: int):
        super().__init__(retry_after)
        self.retry_after = retry_after


def _retry_after(rows: QuerySet[LoginFailure], limit: int) -> int | None:
    """Seconds until ``rows`` (newest first) falls under ``limit`` again, or None when it is under already."""
    window = timedelta(seconds=settings.QUIVER_LOGIN_LOCKOUT_S)
    times = list(rows.order_by("-created_at").values_list("created_at", flat=True)[:limit])
    if len(times) < limit:
        return None
    return max(1, int((times[-1] + window - timezone.now()).total_seconds()) + 1)


def login_throttle_check(*, username: str, ip: str | None) -> None:
    """Refuse a login attempt (before its password is checked) that the rules of this module's docstring refuse.

    Args:
        username: as typed (it may name no user; compared lowercased).
        ip: the client address, None when the server gave none (then the username alone is counted, strictly).

    Raises:
        LoginThrottled: with the seconds until the attempt would be allowed.
    """
    window = timedelta(seconds=settings.QUIVER_LOGIN_LOCKOUT_S)
    recent = LoginFailure.objects.filter(created_at__gte=timezone.now() - window)
    account = recent.filter(username=username.lower())
    here = account.filter(ip=ip) if ip is not None else account
    waits = [_retry_after(here, settings.QUIVER_LOGIN_MAX_FAILURES)]
    if ip is not None:
        waits.append(_retry_after(recent.filter(ip=ip), settings.QUIVER_LOGIN_MAX_FAILURES_PER_IP))
    if here.exists():  # an address that failed for this account: the account-wide ceiling applies to it
        waits.append(_retry_after(account, settings.QUIVER_LOGIN_MAX_FAILURES_PER_ACCOUNT))
    longest = max((w for w in waits if w is not None), default=None)
    if longest is not None:
        raise LoginThrottled(longest)


def login_failure_record(*, username: str, ip: str | None) -> None:
    """Count one failed login (and drop failures older than the window, so the table stays small)."""
    LoginFailure.objects.create(username=username.lower()[:150], ip=ip)
    LoginFailure.objects.filter(
        created_at__lt=timezone.now() - timedelta(seconds=settings.QUIVER_LOGIN_LOCKOUT_S)).delete()


def login_failures_clear(*, username: str, ip: str | None) -> None:
    """Forget this address's failures for a username after it logs in with the right password.

    Only this address's: clearing the username's every failure let the owner's login reset the count of whoever
    was guessing elsewhere (django-axes likewise resets the username + address it matched).
    """
    LoginFailure.objects.filter(username=username.lower(), ip=ip).delete()
