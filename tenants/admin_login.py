"""The Django admin's login, throttled like the console's (``tenants.login_throttle``).

Both logins share one failure count per username and address, so switching doors buys an attacker nothing.
A throttled attempt is answered 429 with ``Retry-After`` before the password is checked.
"""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_protect

from tenants import login_throttle


@never_cache
@csrf_protect
def admin_login(request: HttpRequest) -> HttpResponse:
    """``/admin/login/``: Django's admin login behind the shared login throttle."""
    if request.method != "POST":
        return admin.site.login(request)
    username = str(request.POST.get("username", ""))[:150]
    ip = request.META.get("REMOTE_ADDR")
    try:
        login_throttle.login_throttle_check(username=username, ip=ip)
    except login_throttle.LoginThrottled as exc:
        response = HttpResponse(f"Too many failed logins; try again in {exc.retry_after} s.", status=429,
                                content_type="text/plain")
        response["Retry-After"] = str(exc.retry_after)
        return response
    response = admin.site.login(request)
    if response.status_code == 302:  # logged in: Django's LoginView redirects only on success
        login_throttle.login_failures_clear(username=username, ip=ip)
    else:  # the form came back: wrong password, unknown user or not staff
        login_throttle.login_failure_record(username=username, ip=ip)
    return response
