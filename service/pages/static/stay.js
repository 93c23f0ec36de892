// The stay page: send the stay to this service's /ui/stay/{task} (same origin only) and show
// the answer: the HTML the service drew, or the API's problems (field, rule, allowed values).
"use strict";
(function () {
  var form = document.getElementById("stay-form");
  if (!form) { return; }
  var base = form.getAttribute("data-base") || "";
  var status = document.getElementById("status");
  var result = document.getElementById("result");
  var problems = document.getElementById("problems");

  function mediaType(text) {
    try {
      var body = JSON.parse(text);
      if (body && body.resourceType === "Bundle") { return "application/fhir+json"; }
    } catch (e) { /* the service says what is wrong with it */ }
    return "application/json";
  }

  function cell(row, text) {
    var td = document.createElement("td");
    td.textContent = text === null || text === undefined ? "" : String(text);
    row.appendChild(td);
  }

  function showProblems(code, body) {
    var rows = document.getElementById("problems-rows");
    rows.textContent = "";
    var detail = (body && body.detail) || [];
    document.getElementById("problems-summary").textContent =
      "HTTP " + code + (body && body.error ? ": " + body.error : "") +
      (body && body.request_id ? " (request " + body.request_id + ")" : "");
    detail.forEach(function (p) {
      var tr = document.createElement("tr");
      cell(tr, (p.loc || []).join("."));
      cell(tr, p.rule);
      cell(tr, p.message);
      cell(tr, p.allowed);
      rows.appendChild(tr);
    });
    problems.hidden = false;
    document.getElementById("problems-title").focus();
  }

  // The risk over time: the same stay to /ui/stay/{task}/trajectory, drawn into the slot
  // the answer left for it (only where a landmark model of the task is served).
  async function riskOverTime(text, headers, task) {
    var slot = document.getElementById("trajectory");
    if (!slot) { return; }
    var line = slot.querySelector("p");
    try {
      var answer = await fetch(base + "/ui/stay/" + encodeURIComponent(task) + "/trajectory", {
        method: "POST", headers: headers, body: text, credentials: "same-origin",
        cache: "no-store"
      });
      var body = await answer.text();
      if (answer.ok) { slot.innerHTML = body; return; }
      var parsed = null;
      try { parsed = JSON.parse(body); } catch (e) { parsed = null; }
      var first = parsed && parsed.detail && parsed.detail[0];
      line.textContent = "No risk over time: HTTP " + answer.status +
        (parsed && parsed.error ? " " + parsed.error : "") +
        (first && first.message ? ": " + first.message : "");
    } catch (e) {
      line.textContent = "The service could not be reached: " + e.message;
    }
  }

  async function read() {
    var file = document.getElementById("file").files[0];
    return file ? await file.text() : document.getElementById("stay").value;
  }

  form.addEventListener("submit", async function (event) {
    event.preventDefault();
    problems.hidden = true;
    result.textContent = "";
    status.textContent = "Scoring…";
    var text = await read();
    var headers = { "Content-Type": mediaType(text) };
    var key = document.getElementById("key");
    if (key && key.value) { headers["X-API-Key"] = key.value; }
    var task = document.getElementById("task").value;
    try {
      var answer = await fetch(base + "/ui/stay/" + encodeURIComponent(task), {
        method: "POST", headers: headers, body: text, credentials: "same-origin",
        cache: "no-store"
      });
      var body = await answer.text();
      if (answer.ok) {
        status.textContent = "Answered.";
        result.innerHTML = body;
        var title = document.getElementById("result-title");
        if (title) { title.focus(); }
        await riskOverTime(text, headers, task);
        return;
      }
      status.textContent = "Refused.";
      var parsed = null;
      try { parsed = JSON.parse(body); } catch (e) { parsed = { error: body.slice(0, 200) }; }
      showProblems(answer.status, parsed);
    } catch (e) {
      status.textContent = "The service could not be reached: " + e.message;
    }
  });
})();
