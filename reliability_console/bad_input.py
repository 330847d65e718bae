"""Refuse requests whose URL or form fields hold a NUL character, before any view queries with them.

PostgreSQL text cannot hold (or even compare against) a NUL character: a
filter, lookup or path segment with one raises from the database driver, a
500. No name, id, key or filter value of ours can contain one, so such a
request is malformed as a whole: a 400 before any view runs, JSON with the
API's error shape under ``/api/``, Django's plain 400 page elsewhere.
Request bodies of the API are checked by its own parser (tasks.api.parser).
"""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest

from tasks.api.errors import error_response

NUL = "\x00"
FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


def _holds_nul(query) -> bool:
    return any(NUL in key or any(NUL in value for value in values) for key, values in query.lists())


def _is_form(request: HttpRequest) -> bool:
    return request.META.get("CONTENT_TYPE", "").split(";")[0].strip().lower() in FORM_TYPES


class RejectNulMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        in_url = NUL in request.path or _holds_nul(request.GET)
        # Only forms are read here (the API's JSON bodies have their own checks);
        # a form over the upload limit is left for Django to refuse as it does.
        in_form = request.method == "POST" and _is_form(request) and not in_url and self._form_holds_nul(request)
        if not (in_url or in_form):
            return self.get_response(request)
        where = "URL" if in_url else "form"
        if request.path.startswith("/api/"):
            return error_response(400, "validation_error", f"the {where} holds a NUL character", {where.lower(): "NUL"})
        return HttpResponseBadRequest(f"Bad request: the {where} holds a NUL character.", content_type="text/plain")

    @staticmethod
    def _form_holds_nul(request: HttpRequest) -> bool:
        try:
            return _holds_nul(request.POST)
        except Exception:
            return False
