"""GET /: the paste-text page. Plain HTML, CSS and JavaScript served by this app; nothing external."""

from __future__ import annotations

from flask import Blueprint, render_template


def blueprint(api, services) -> Blueprint:
    bp = Blueprint("page", __name__)

    @api.route(bp, "/", methods=["GET"], summary="The paste-text page",
               responses={200: ("text/html", "an HTML page that posts to /v1/detect")}, tags=["page"])
    def index():
        return render_template("detector_index.html", max_text_chars=services.settings.max_text_chars)

    return bp
