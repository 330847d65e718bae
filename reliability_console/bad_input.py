"""Bad input in admin and API URLs answers a 4xx, never a 500.

``RejectNulMiddleware`` refuses requests whose URL or form fields hold a NUL
character, before any view queries with them.

PostgreSQL text cannot hold (or even compare against) a NUL character: a
filter, lookup or path segment with one raises from the database driver, a
500. No name, id, key or filter value of ours can contain one, so such a
request is malformed as a whole: a 400 before any view runs, JSON with the
API's error shape under ``/api/``, Django's plain 400 page elsewhere.
Request bodies of the API are checked by its own parser (tasks.api.parser).

``InvalidFilterMiddleware`` gives the admin's own answer to a filter it cannot
apply (a NUL character in a filter value too). The admin allows any lookup on a model's own fields (``?x__range=1``,
``?ip__gt=-1``, ``?name__regex=(``); Django turns the errors it meets while
*building* the query into its "invalid filter" redirect, but a value the
database refuses (an inet, a regular expression) or a lookup that fails only
when the SQL is compiled raises later, while the page renders. Such an error
on a GET of an admin page with a query string is that filter's fault: the
same redirect, with a message, and a warning in the log.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.contrib import messages
from django.contrib.admin.views.main import ERROR_FLAG
from django.core.exceptions import FieldError, ValidationError
from django.db import DataError
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, HttpResponseRedirect
from django.utils.translation import gettext as _

from tasks.api.errors import error_response
from tasks.database_errors import refused_by_driver

logger = logging.getLogger(__name__)

NUL = "\x00"
# What a filter value the database or the SQL compiler cannot use raises (psycopg2's refusal of parameters that
# do not fit the SQL, ``?x__range=abc``, is a TypeError or IndexError; psycopg 3's is tasks.database_errors').
FILTER_ERRORS = (DataError, FieldError, ValidationError, ValueError, TypeError, IndexError)
FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


def _holds_nul(query) -> bool:
    return any(NUL in key or any(NUL in value for value in values) for key, values in query.lists())


def _is_admin_filter(request: HttpRequest) -> bool:
    return request.method in ("GET", "HEAD") and request.path.startswith("/admin/") and bool(request.GET)


def _is_form(request: HttpRequest) -> bool:
    return request.META.get("CONTENT_TYPE", "").split(";")[0].strip().lower() in FORM_TYPES


class RejectNulMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if _is_admin_filter(request) and NUL not in request.path:
            return self.get_response(request)  # a filter of an admin list: InvalidFilterMiddleware answers it
        in_url = NUL in request.path or _holds_nul(request.GET)
        # Only the console's forms are read here: the API takes JSON only, which it checks itself, and a form
        # read here would leave an API view unable to read its body (a 500 where the API answers 415). A form
        # over the upload limit is left for Django to refuse as it does.
        in_form = (
            request.method == "POST"
            and not request.path.startswith("/api/")
            and _is_form(request)
            and not in_url
            and self._form_holds_nul(request)
        )
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
        except Exception:  # a malformed or too large form: left for Django's own answer when the view reads it
            return False


class InvalidFilterMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if _is_admin_filter(request) and _holds_nul(request.GET):
            return self._invalid_filter(request, None)
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not _is_admin_filter(request) or not (isinstance(exception, FILTER_ERRORS) or refused_by_driver(exception)):
            return None
        return self._invalid_filter(request, exception)

    @staticmethod
    def _invalid_filter(request: HttpRequest, exception: Exception | None) -> HttpResponse:
        # With its traceback: should a page's own bug ever land here, the log still shows where.
        logger.warning(
            "admin filter could not be applied",
            exc_info=exception,
            extra={
                "event": "admin_invalid_filter",
                "path": request.path,
                "error_class": type(exception).__name__ if exception else "NUL",
            },
        )
        if ERROR_FLAG in request.GET:  # already the plain list: do not redirect in a loop
            return HttpResponseBadRequest(_("That filter cannot be applied."), content_type="text/plain")
        messages.error(request, _("That filter cannot be applied; showing the list without it."))
        return HttpResponseRedirect(f"{request.path}?{ERROR_FLAG}=1")
