// The page at /: a form for a request, a progress bar fed by the job's Server-Sent Events, the
// picture (or the video's link) when done, and Cancel. Plain HTML and JavaScript in the binary:
// nothing to build, nothing fetched from elsewhere.
#include "server/routes.h"

namespace cubevec::server {

namespace {

constexpr const char* kPage = R"HTML(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>cubevec</title>
<style>
  body { font: 15px system-ui, sans-serif; margin: 0; background: #f4f5f7; color: #1d2330; }
  header { background: #1d2330; color: #fff; padding: 10px 20px; font-weight: 600; }
  main { display: flex; gap: 20px; padding: 20px; flex-wrap: wrap; }
  form, #output { background: #fff; border-radius: 8px; padding: 16px; box-shadow: 0 1px 3px #0002; }
  form { width: 340px; display: grid; gap: 8px; align-content: start; }
  label { display: grid; gap: 3px; font-size: 13px; color: #4a5263; }
  textarea, input, select { font: inherit; padding: 5px; border: 1px solid #c8ccd4; border-radius: 4px; box-sizing: border-box; width: 100%; min-width: 0; }
  [hidden] { display: none !important; }
  .row { display: flex; gap: 8px; } .row label { flex: 1; min-width: 0; }
  fieldset { border: 1px solid #dde0e6; border-radius: 4px; font-size: 13px; }
  button { font: inherit; padding: 8px; border: 0; border-radius: 4px; cursor: pointer; }
  #generate { background: #2f6fde; color: #fff; } #cancel { background: #e4e6ea; }
  #output { flex: 1; min-width: 300px; }
  progress { width: 100%; height: 14px; }
  #status { font-size: 13px; color: #4a5263; min-height: 1.3em; }
  #status.error { color: #b3261e; }
  #result img { max-width: 100%; image-rendering: pixelated; min-width: 256px; border-radius: 4px; }
  #result a { font-size: 13px; }
</style>
</head>
<body>
<header>cubevec</header>
<main>
<form id="form">
  <label>Model <select id="model"></select></label>
  <label>Prompt <textarea id="prompt" rows="3" required>a red circle on a blue background</textarea></label>
  <label>Negative prompt <textarea id="negative_prompt" rows="2"></textarea></label>
  <div class="row">
    <label>Width <input id="width" type="number" min="16" step="16" placeholder="default"></label>
    <label>Height <input id="height" type="number" min="16" step="16" placeholder="default"></label>
  </div>
  <div class="row">
    <label>Steps <input id="num_inference_steps" type="number" min="1" placeholder="default"></label>
    <label>Guidance <input id="guidance_scale" type="number" min="0" step="0.1" placeholder="default"></label>
    <label>Seed <input id="seed" type="number" min="0" value="0"></label>
  </div>
  <label id="frames_label" hidden>Frames <input id="num_frames" type="number" min="1" step="4" placeholder="default"></label>
  <fieldset><legend>Stages</legend>
    <label>Step cache <select id="cache"><option value="">none</option><option>db</option><option>dit-block</option><option>attention</option></select></label>
    <label>Sparse attention <select id="sparse"><option value="">none</option><option>ada_bsa</option><option>rf_v2</option></select></label>
    <label>CFG <select id="cfg"><option value="">model default</option><option>off</option><option>fused</option><option>streams</option></select></label>
  </fieldset>
  <button id="generate" type="submit">Generate</button>
  <button id="cancel" type="button" disabled>Cancel</button>
</form>
<section id="output">
  <progress id="progress" max="1" value="0"></progress>
  <div id="status">Ready.</div>
  <div id="result"></div>
</section>
</main>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
let models = [], job = null, events = null, playing = null;

function setStatus(text, error) { $("status").textContent = text; $("status").className = error ? "error" : ""; }

async function loadModels() {
  const r = await fetch("/v1/models");
  models = (await r.json()).data;
  for (const m of models) $("model").add(new Option(m.id + " (" + m.task + ")", m.id));
  modelChanged();
}
function modelChanged() {
  const m = models.find((x) => x.id === $("model").value);
  $("frames_label").hidden = !(m && m.task === "t2v");
}

function requestBody() {
  const body = { model: $("model").value, prompt: $("prompt").value };
  for (const key of ["negative_prompt", "cache", "sparse", "cfg"]) if ($(key).value) body[key] = $(key).value;
  for (const key of ["width", "height", "num_inference_steps", "seed", "num_frames"])
    if ($(key).value !== "" && !$(key).closest("[hidden]")) body[key] = parseInt($(key).value, 10);
  if ($("guidance_scale").value !== "") body.guidance_scale = parseFloat($("guidance_scale").value);
  return body;
}

function finish() {
  if (events) events.close();
  events = null;
  $("generate").disabled = false;
  $("cancel").disabled = true;
}

async function generate(e) {
  e.preventDefault();
  $("generate").disabled = true;
  if (playing) clearInterval(playing);
  playing = null;
  $("result").textContent = "";
  $("progress").value = 0;
  setStatus("Queued…");
  const r = await fetch("/v1/jobs", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(requestBody()) });
  const answer = await r.json();
  if (!r.ok) { setStatus(answer.error.message, true); finish(); return; }
  job = answer;
  $("cancel").disabled = false;
  events = new EventSource("/v1/jobs/" + job.id + "/events");
  events.addEventListener("progress", (m) => {
    const p = JSON.parse(m.data);
    $("progress").value = p.step / p.steps * 0.95;
    setStatus("Step " + p.step + " of " + p.steps + (p.eta > 0 ? ", about " + p.eta.toFixed(1) + " s left" : ""));
  });
  events.addEventListener("decoding", () => setStatus("Decoding…"));
  events.addEventListener("completed", (m) => {
    const done = JSON.parse(m.data);
    $("progress").value = 1;
    setStatus("Done in " + done.seconds.toFixed(2) + " s (seed " + done.request.seed + ").");
    const url = done.result.urls[0];
    if (models.find((x) => x.id === done.model).task === "t2v") {
      // The frames as PNGs, played in turn at 16 fps, and the AVI to download.
      const frames = [];
      for (let i = 0; i < done.result.outputs; ++i) { const f = new Image(); f.src = done.result.frames_url + i + ".png"; frames.push(f); }
      const img = new Image();
      img.id = "frame"; img.alt = done.request.prompt; img.src = frames[0].src;
      let shown = 0;
      playing = setInterval(() => { shown = (shown + 1) % frames.length; img.src = frames[shown].src; }, 1000 / 16);
      const a = document.createElement("a");
      a.href = url; a.textContent = "Download the video (AVI, " + frames.length + " frames)"; a.id = "video_link";
      $("result").append(img, document.createElement("br"), a);
    } else {
      const img = new Image();
      img.id = "picture"; img.alt = done.request.prompt; img.src = url;
      $("result").append(img);
    }
    finish();
  });
  for (const name of ["failed", "cancelled"])
    events.addEventListener(name, (m) => { const d = JSON.parse(m.data); setStatus(d.error ? d.error.message : name, true); finish(); });
  events.onerror = () => { if (events && events.readyState === EventSource.CLOSED) { setStatus("The connection to the server was lost.", true); finish(); } };
}

$("form").addEventListener("submit", generate);
$("model").addEventListener("change", modelChanged);
$("cancel").addEventListener("click", async () => { if (job) await fetch("/v1/jobs/" + job.id, { method: "DELETE" }); });
loadModels().catch((e) => setStatus("Cannot list the models: " + e, true));
</script>
</body>
</html>
)HTML";

}  // namespace

void add_web_page_route(httplib::Server& http, ServerContext& context) {
  add_route(http, context, "GET", "/", [](const httplib::Request&, httplib::Response& response) {
    response.set_header("Content-Security-Policy",
                        "default-src 'self'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src 'self'");
    response.set_content(kPage, "text/html; charset=utf-8");
  });
}

}  // namespace cubevec::server
