// provmark detector page: posts the pasted text to /v1/detect and shows the verdict.
// The API token lives in sessionStorage only (this tab) and goes out as a Bearer header.
// All text is inserted with textContent: nothing from the page or the server is parsed as HTML.
"use strict";

(function () {
  const TOKEN_KEY = "provmark.detector.token";
  const $ = (id) => document.getElementById(id);
  const form = $("detect-form");
  const textBox = $("text");
  const tokenBox = $("token");
  const maxChars = Number(textBox.dataset.maxChars);

  function countChars(text) {
    return Array.from(text).length; // code points, as the service counts them
  }

  function setHidden(element, hidden) {
    element.hidden = hidden;
  }

  function showError(message) {
    $("error-message").textContent = message;
    setHidden($("error"), false);
    setHidden($("result"), true);
    $("error").focus?.();
  }

  function formatP(p) {
    if (p === null || p === undefined) return "–";
    if (p === 0) return "< 1e-300";
    return p < 0.001 ? p.toExponential(2) : p.toPrecision(3);
  }

  function formatZ(z) {
    return z === null || z === undefined ? "n/a" : z.toFixed(2);
  }

  function messageFor(status, body, askedExplain, response) {
    const detail = body && body.error ? body.error.message : "";
    switch (status) {
      case 401:
        return "This service needs an API token with the “detect” scope. Paste it in the API token field. (" + detail + ")";
      case 403:
        if (askedExplain) {
          return "Your token lacks the “explain” scope, so per-token colours cannot be shown: they reveal part of " +
            "the watermark's green lists. Untick “Colour every token green or red” and check again.";
        }
        return "Your token lacks the “detect” scope. (" + detail + ")";
      case 413:
        return "The text is too long for this service: " + detail;
      case 429: {
        const wait = response.headers.get("Retry-After");
        return "Too many requests for this token. Try again in " + (wait || "a few") + " seconds.";
      }
      case 503:
        return "The service's database is unreachable right now; nothing was stored. Try again shortly.";
      default:
        return detail ? detail + " (HTTP " + status + ")" : "The service answered HTTP " + status + ".";
    }
  }

  function verdictSummary(d) {
    if (d.verdict === "watermarked") {
      const found = d.decided_by === "window"
        ? "A passage of the text carries the watermark."
        : "The text carries the watermark.";
      // the own-output spoof check (docs/security.md): greens where a watermark thief's would be
      return d.spoof_suspected === true
        ? found + " Spoof suspected: its green tokens sit where a watermark thief's would."
        : found;
    }
    if (d.spoof_suspected === true) {
      // a two-part key: the public half says watermarked, the private half says it was imitated
      return "Not ours: the text passes this key's public half only, as text written to imitate the " +
        "watermark does (spoof suspected).";
    }
    if (d.verdict === "insufficient_text") {
      // a detect-scope answer carries no counts (docs/security.md): only the length needed
      const scored = d.num_tokens_scored == null ? "" : ": " + d.num_tokens_scored + " tokens scored";
      return "Too little text to tell" + scored + " (at least " + d.min_tokens + " scored tokens are needed for a " +
        "negative answer).";
    }
    return "No watermark found at z ≥ " + d.z_threshold + ".";
  }

  // Segments of the text between every token and window boundary, each with its classes.
  function renderPassage(text, d) {
    const chars = Array.from(text);
    const cuts = new Set([0, chars.length]);
    // explain scope: the full window report; detect scope: only the detected span
    const windowBest = d.windows && d.windows.detected ? (d.windows.best || d.windows) : null;
    if (windowBest) {
      cuts.add(windowBest.char_start);
      cuts.add(windowBest.char_end);
    }
    const tokenAt = new Map();
    for (const token of d.explanation || []) {
      cuts.add(token.char_start);
      cuts.add(token.char_end);
      tokenAt.set(token.char_start, token);
    }
    const points = Array.from(cuts).filter((c) => c >= 0 && c <= chars.length).sort((a, b) => a - b);
    const passage = $("passage");
    passage.replaceChildren();
    let current = null;
    for (let i = 0; i + 1 < points.length; i++) {
      const start = points[i];
      const end = points[i + 1];
      if (tokenAt.has(start)) current = tokenAt.get(start);
      if (current && start >= current.char_end) current = null;
      const inWindow = windowBest && start >= windowBest.char_start && end <= windowBest.char_end;
      const element = document.createElement(inWindow ? "mark" : "span");
      if (inWindow) element.classList.add("window");
      if (current && current.scored && current.counted) {
        element.classList.add(current.green ? "tok-green" : "tok-red");
        element.title = current.green ? "green token" : "red token";
      }
      element.textContent = chars.slice(start, end).join("");
      passage.appendChild(element);
    }
    const hasTokens = Array.isArray(d.explanation);
    passage.classList.toggle("explained", hasTokens);
    document.querySelector("#legend-window .swatch").classList.toggle("edge", hasTokens);
    for (const item of document.querySelectorAll(".token-legend")) setHidden(item, !hasTokens);
    setHidden($("legend-window"), !windowBest);
    let note = "";
    if (windowBest) {
      note = "Highlighted: the most significant passage, characters " + windowBest.char_start + "–" +
        windowBest.char_end + (windowBest.z_score == null ? "." : " (z = " + formatZ(windowBest.z_score) + ", p = " +
        formatP(windowBest.p_value_corrected) + " after testing " + d.windows.num_windows_tested + " windows).");
    } else if (d.windows) {
      note = "No passage stands out on its own.";
    }
    if (hasTokens) note += (note ? " " : "") + "Each scored token is coloured green or red.";
    $("passage-note").textContent = note;
    setHidden($("passage-block"), !(windowBest || hasTokens));
  }

  // Bring the highlighted passage into view inside the scrolling text box (once it is laid out).
  function scrollToWindow() {
    const passage = $("passage");
    const firstMark = passage.querySelector("mark.window");
    passage.scrollTop = firstMark ? Math.max(0, firstMark.offsetTop - passage.offsetTop - 24) : 0;
  }

  function renderProvenance(d) {
    const line = $("provenance");
    if (d.provenance) {
      const p = d.provenance;
      line.textContent = "Generation receipt " + p.receipt_id + ": generated by " + p.model_id + " with key " +
        p.key_id + " at " + p.created_at + (p.match === "exact" ? " (exactly this text)." : " (this text after normalisation).");
    } else {
      line.textContent = "No generation receipt matches this exact text.";
    }
    setHidden(line, false);
  }

  // Beside the verdict: does the text restate, in other words, an output the service remembers writing?
  function renderParaphrase(d) {
    const line = $("paraphrase");
    const p = d.paraphrase_of_own_output;
    if (!p) {
      setHidden(line, true);
      return;
    }
    if (p.matched) {
      line.textContent = "Paraphrase of our own output" + (p.receipt_id ? ": receipt " + p.receipt_id : "") +
        (p.similarity != null ? " (similarity " + p.similarity.toFixed(3) + ", false-match rate on human text " +
          p.false_match_rate.toExponential(1) + "; an unrelated output of ours reaches it at " +
          p.other_output_rate.toExponential(1) + ")" : "") + ". This does not change the watermark verdict.";
    } else {
      line.textContent = "Not a paraphrase of any output the service remembers" +
        (p.similarity != null ? " (nearest similarity " + p.similarity.toFixed(3) + ")." : ".");
    }
    setHidden(line, false);
  }

  // The second layer: what the text's C2PA manifest says, beside the watermark verdict.
  function renderCredentials(d) {
    const block = $("credentials-block");
    const facts = $("credentials-facts");
    facts.replaceChildren();
    const c = d.credentials;
    if (!c) {
      $("credentials-summary").textContent = "No C2PA Content Credentials in or with this text.";
      setHidden(block, false);
      return;
    }
    const where = c.source === "embedded" ? "embedded in the text" : "in the manifest file";
    let summary;
    if (c.trusted) summary = "Trusted: signed by a certificate this service trusts, and the text is exactly the one signed.";
    else if (c.valid) summary = "Valid, but signed by a certificate this service does not trust.";
    else if (c.hash_matches === false) summary = "Invalid: the text was changed after it was signed.";
    else summary = "Invalid: " + (c.problem || (c.failures || []).join(", ") || "the manifest does not verify") + ".";
    $("credentials-summary").textContent = summary + " (C2PA manifest " + where + ")";
    const rows = [
      ["Manifest", c.manifest_id || "–"],
      ["Text matches the signed hash", c.hash_matches === null ? "–" : c.hash_matches ? "yes" : "no"],
      ["Signature", c.signature_valid === null ? "–" : c.signature_valid ? "valid" : "invalid"],
      ["Model", c.model_id || "–"],
      ["Issuer", c.provenance && c.provenance.issuer ? c.provenance.issuer : "–"],
      ["Watermark it names", c.soft_binding ? (c.soft_binding.key_id || "–") + " (" + c.soft_binding.alg + ")" : "none"],
      ["Agrees with the watermark verdict", c.soft_binding_agrees === null ? "–" : c.soft_binding_agrees ? "yes" : "no"],
    ];
    for (const [name, value] of rows) {
      const dt = document.createElement("dt");
      dt.textContent = name;
      const dd = document.createElement("dd");
      dd.textContent = value;
      facts.append(dt, dd);
    }
    setHidden(block, false);
  }

  async function manifestBase64() {
    const file = $("manifest").files[0];
    if (!file) return null;
    const bytes = new Uint8Array(await file.arrayBuffer());
    let binary = "";
    for (let i = 0; i < bytes.length; i += 0x8000) binary += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
    return btoa(binary);
  }

  function render(text, d) {
    setHidden($("error"), true);
    const badge = $("verdict");
    badge.className = "badge " + d.verdict;
    badge.textContent = d.verdict.replace(/_/g, " ");
    $("verdict-summary").textContent = verdictSummary(d);
    $("z-score").textContent = formatZ(d.z_score);
    $("p-value").textContent = formatP(d.p_value);
    $("tokens-scored").textContent = d.num_tokens_scored == null ? "–" : String(d.num_tokens_scored);
    $("green-fraction").textContent = d.num_tokens_scored
      ? d.num_green_tokens + " (" + (100 * d.green_fraction).toFixed(1) + "%)"
      : "–";
    $("key-id").textContent = d.key_id || "–";
    $("verdict-id").textContent = d.id;
    renderProvenance(d);
    renderParaphrase(d);
    renderCredentials(d);
    renderPassage(text, d);
    setHidden($("result"), false);
    scrollToWindow();
  }

  async function submit(event) {
    event.preventDefault();
    const text = textBox.value;
    const token = tokenBox.value.trim();
    const explain = $("opt-explain").checked;
    if (countChars(text) > maxChars) {
      showError("The text has " + countChars(text).toLocaleString() + " characters; this service accepts at most " +
        maxChars.toLocaleString() + ".");
      return;
    }
    const headers = { "Content-Type": "application/json", Accept: "application/json" };
    if (token) headers.Authorization = "Bearer " + token;
    const button = $("submit");
    button.disabled = true;
    setHidden($("busy"), false);
    setHidden($("result"), true); // never leave an old verdict next to a new text
    setHidden($("error"), true);
    try {
      const request = { text, windows: $("opt-windows").checked, explain };
      const manifest = await manifestBase64();
      if (manifest) request.manifest = manifest;
      const response = await fetch("/v1/detect", {
        method: "POST",
        headers,
        body: JSON.stringify(request),
        credentials: "omit",
        cache: "no-store",
      });
      let body = null;
      try {
        body = await response.json();
      } catch (_) {
        body = null;
      }
      if (response.ok && body) render(text, body);
      else showError(messageFor(response.status, body, explain, response));
    } catch (error) {
      showError("The service could not be reached (" + error.message + ").");
    } finally {
      button.disabled = false;
      setHidden($("busy"), true);
    }
  }

  tokenBox.value = sessionStorage.getItem(TOKEN_KEY) || "";
  tokenBox.addEventListener("input", () => {
    const token = tokenBox.value.trim();
    if (token) sessionStorage.setItem(TOKEN_KEY, token);
    else sessionStorage.removeItem(TOKEN_KEY);
  });
  textBox.addEventListener("input", () => {
    $("char-count").textContent = countChars(textBox.value).toLocaleString();
  });
  $("clear").addEventListener("click", () => {
    textBox.value = "";
    $("manifest").value = "";
    $("char-count").textContent = "0";
    setHidden($("result"), true);
    setHidden($("error"), true);
    textBox.focus();
  });
  form.addEventListener("submit", submit);
})();
