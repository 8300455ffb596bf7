// The forecast page's controls: each choice is looked up in the grid the book's build computed
// (ddp_core/analysis/cluster_forecast.py); this script only finds the row and shows it. No forecast is computed here.
// The site loads it on every page; it acts only on the page that holds the grid.
document.addEventListener("DOMContentLoaded", function () {
  const grid = document.getElementById("forecast-grid");
  if (!grid) return;
  const data = JSON.parse(grid.textContent);
  const keys = Object.keys(data.choices);
  const rows = new Map(data.rows.map((row) => [keys.map((k) => String(row[k])).join("|"), row]));
  const control = (key) => document.getElementById("choose-" + key);
  const show = (id, text) => { document.getElementById(id).textContent = text; };
  const digits = (value, n) => (value >= 100 ? value.toFixed(0) : value.toPrecision(n));

  const refused = [];
  for (const key of keys) {  // each control offers the grid's values, opens on the default or the address's choice
    const select = control(key);
    for (const value of data.choices[key]) select.add(new Option(String(value), String(value)));
    const asked = new URLSearchParams(window.location.search).get(key);
    const offered = data.choices[key].map(String).includes(asked);
    select.value = offered ? asked : String(data.default[key]);
    if (asked !== null && !offered) {
      refused.push(`${key}=${asked}`);
      document.getElementById("f-refused").hidden = false;
    }
    select.addEventListener("change", update);
  }
  show("f-refused-keys", refused.join(", "));

  function draw(row) {  // one step: backward's span, and each bucket's all-reduce where the replay put it
    const svg = document.getElementById("forecast-step");
    const end = Math.max(row.step_ms, ...row.buckets_ms.map((b) => b[1]));
    const x = (ms) => 10 + (600 * ms) / end;
    let parts = `<rect x="${x(0)}" y="10" width="${x(row.backward_ms[0]) - x(0)}" height="18" fill="#9ecae1"/>` +
      `<rect x="${x(row.backward_ms[0])}" y="10" width="${x(row.backward_ms[1]) - x(row.backward_ms[0])}" ` +
      `height="18" fill="#3182bd"/>`;
    row.buckets_ms.forEach((b, k) => {
      parts += `<rect x="${x(b[0])}" y="34" width="${Math.max(1, x(b[1]) - x(b[0]))}" height="18" ` +
        `fill="${k % 2 ? "#fd8d3c" : "#e6550d"}"/>`;
    });
    svg.innerHTML = parts + `<line x1="${x(row.step_ms)}" y1="4" x2="${x(row.step_ms)}" y2="58" stroke="black"/>` +
      `<text x="${x(0)}" y="72" font-size="11">0 ms</text>` +
      `<text x="${x(row.step_ms)}" y="72" font-size="11" text-anchor="end">${digits(row.step_ms, 3)} ms</text>`;
  }

  function update() {
    const row = rows.get(keys.map((k) => control(k).value).join("|"));
    show("f-gpus", row.gpus);
    show("f-speedup", digits(row.speedup, 3));
    show("f-outcome", row.outcome);
    show("f-efficiency", digits(100 * row.efficiency, 2) + "%");
    show("f-step", digits(row.step_ms, 3));
    show("f-whole", digits(row.whole_ms, 3));
    show("f-compute", digits(row.compute_ms, 3));
    show("f-exposed", digits(row.exposed_ms, 3));
    show("f-comm", digits(row.comm_ms, 3));
    show("f-low", digits(row.speedup_no_overlap, 3));
    show("f-high", digits(row.speedup_last_bucket, 3));
    show("f-break-even", digits(row.break_even_ms, 3));
    show("f-validated", row.validated ? "within" : "beyond");
    document.getElementById("f-high-reached").hidden = !row.last_bucket_reachable;
    document.getElementById("f-high-unreached").hidden = row.last_bucket_reachable;
    document.getElementById("forecast-answer").classList.toggle("extrapolated", !row.validated);
    document.getElementById("forecast-answer").dataset.speedup = row.speedup;
    draw(row);
  }
  update();
});
