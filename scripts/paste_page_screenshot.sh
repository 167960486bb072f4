#!/usr/bin/env bash
# The paste page's picture in the tutorial (docs/img/paste-page.png): tests/test_paste_page.py serves the
# detector on a loopback port, checks a watermarked sample text in headless Chromium (Playwright) with a
# detect-scope token, and keeps its screenshots in PROVMARK_SCREENSHOT_DIR; this copies the verdict's one.
# Needs Chromium (/usr/bin/chromium, or PROVMARK_CHROMIUM) and the playwright package, as the test does.
set -euo pipefail
cd "$(dirname "$0")/.."
shots=$(mktemp -d)
trap 'rm -rf "$shots"' EXIT
PROVMARK_SCREENSHOT_DIR="$shots" .venv/bin/python -m pytest -q -p no:randomly tests/test_paste_page.py \
    -k test_verdicts_in_the_browser
cp "$shots/paste-page-watermarked.png" docs/img/paste-page.png
echo "wrote docs/img/paste-page.png"
