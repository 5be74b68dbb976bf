// A study's page (kvinject report --html): the manifest, the table with its filters and sort,
// the figures (Vega-Lite, through vega-embed, inlined above) and the items of generation benches.
"use strict";
const DATA = JSON.parse(document.getElementById("kv-data").textContent);
const FIGURES = JSON.parse(document.getElementById("kv-figures").textContent);
const FILTERS = [["model", (r) => r._.model_file], ["bench", (r) => r.bench], ["metric", (r) => r.metric],
  ["family", (r) => r._.family], ["cache", (r) => r._.cache]];
// configuration: the text a row's configuration contains, or (exact, a figure's point clicked) is
const state = {sort: null, descending: false, configuration: "", exact: false};

function element(tag, attributes, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attributes || {})) e.setAttribute(k, v);
  for (const c of children) e.append(c);
  return e;
}

function manifest() {
  const m = DATA.manifest;
  const list = document.getElementById("kv-manifest");
  const line = (name, value) => list.append(element("dt", {}, name), element("dd", {}, value));
  line("models", m.models.map((x) => `${x.model} (sha256 ${x.sha256})`).join("; "));
  line("made by", Object.entries(m.versions).map(([k, v]) => `${k} ${v}`).join(", "));
  line("stores", m.stores.map((s) => s.first ? `${s.path} (runs written ${s.first} to ${s.last} UTC)` : s.path).join("; "));
  line("records", `${m.records} runs of ${m.configurations} configurations`);
  for (const [k, v] of Object.entries(m.settings)) line(k, v.join(", "));
}

function filters() {
  const box = document.getElementById("kv-filters");
  for (const [name, value] of FILTERS) {
    const values = [...new Set(DATA.rows.map(value))].sort();
    const select = element("select", {id: `kv-filter-${name}`}, element("option", {value: ""}, `every ${name}`));
    for (const v of values) select.append(element("option", {value: v}, v));
    select.addEventListener("change", table);
    box.append(element("label", {}, `${name} `, select));
  }
  const text = element("input", {id: "kv-filter-configuration", type: "search", placeholder: "configuration contains"});
  text.addEventListener("input", () => { state.configuration = text.value; state.exact = false; table(); });
  const clear = element("button", {id: "kv-clear", type: "button"}, "show every row");
  clear.addEventListener("click", () => {
    for (const [name] of FILTERS) document.getElementById(`kv-filter-${name}`).value = "";
    text.value = state.configuration = "";
    table();
  });
  box.append(text, clear);
}

function shown() {
  let rows = DATA.rows.filter((r) => FILTERS.every(([name, value]) => {
    const chosen = document.getElementById(`kv-filter-${name}`).value;
    return !chosen || value(r) === chosen;
  }));
  if (state.configuration) {
    rows = rows.filter((r) => state.exact ? r.configuration === state.configuration : r.configuration.includes(state.configuration));
  }
  if (state.sort) {
    const key = state.sort;
    const order = state.descending ? -1 : 1;
    rows = [...rows].sort((a, b) => {
      const x = a[key], y = b[key];
      if (x === y) return 0;
      if (x === null || x === undefined || x === "") return 1;  // nothing measured: last either way
      if (y === null || y === undefined || y === "") return -1;
      return (typeof x === "number" && typeof y === "number" ? x - y : String(x).localeCompare(String(y))) * order;
    });
  }
  return rows;
}

function table() {
  const rows = shown();
  const head = element("tr");
  for (const c of DATA.columns) {
    const th = element("th", {"data-key": c.key}, c.name + (state.sort === c.key ? (state.descending ? " ▼" : " ▲") : ""));
    th.addEventListener("click", () => {
      state.descending = state.sort === c.key && !state.descending;
      state.sort = c.key;
      table();
    });
    head.append(th);
  }
  head.append(element("th", {}, "items"));
  const body = element("tbody");
  for (const r of rows) {
    const tr = element("tr", {"data-id": r._.id, class: r._.control ? "control" : ""});
    for (const c of DATA.columns) tr.append(element("td", {class: typeof r[c.key] === "number" ? "number" : ""}, r._.cells[c.key] ?? "-"));
    const items = DATA.items[String(r._.id)];
    const cell = element("td");
    if (items) {
      const open = element("button", {type: "button", class: "kv-items"}, `${items.differ}/${items.total} differ`);
      open.addEventListener("click", () => drill(r, items));
      cell.append(open);
    }
    tr.append(cell);
    body.append(tr);
  }
  document.getElementById("kv-table").replaceChildren(element("thead", {}, head), body);
  document.getElementById("kv-count").textContent = `${rows.length} of ${DATA.rows.length} rows`;
}

function drill(row, items) {
  const box = document.getElementById("kv-drill");
  const verdict = (v) => v === null ? "-" : String(v);
  const body = element("tbody");
  for (const it of items.items) {
    body.append(element("tr", {}, element("td", {}, String(it.item)), element("td", {class: "response"}, it.control),
      element("td", {}, verdict(it.control_verdict)), element("td", {class: "response"}, it.response), element("td", {}, verdict(it.verdict))));
  }
  const head = element("tr", {}, ...["item", "control's response", items.metric, `${row.configuration}'s response`, items.metric].map((h) => element("th", {}, h)));
  const close = element("button", {type: "button", id: "kv-drill-close"}, "close");
  close.addEventListener("click", () => { box.hidden = true; });
  box.replaceChildren(
    element("h3", {}, `${row.bench}, ${row.configuration}: the first run's items beside the control's`),
    element("p", {}, `${items.differ} of ${items.total} items differ from the control; ${items.items.length} shown, those that differ first ` +
      "(the store keeps the responses, not the prompts: an item is its place in the bench's data)"),
    close, element("table", {}, element("thead", {}, head), body));
  box.hidden = false;
  box.scrollIntoView();
}

async function figures() {
  const box = document.getElementById("kv-figures-box");
  window.kvViews = {};
  for (const [name, figure] of Object.entries(FIGURES)) {
    const div = element("div", {id: `kv-figure-${name}`, class: "figure"});
    box.append(element("h3", {}, figure.title), div);
    const result = await vegaEmbed(div, figure.spec, {renderer: "svg", actions: false, mode: "vega-lite"});
    result.view.addEventListener("click", (event, item) => {
      const configuration = item && item.datum && item.datum.configuration;
      if (!configuration) return;
      state.configuration = configuration;
      state.exact = true;
      document.getElementById("kv-filter-configuration").value = configuration;
      table();
      document.getElementById("kv-table").scrollIntoView();
    });
    window.kvViews[name] = result.view;
  }
  document.body.dataset.figures = String(Object.keys(FIGURES).length);
  document.body.dataset.drawnMs = String(Math.round(performance.now()));  // from navigation to every figure drawn
}

manifest();
filters();
table();
figures().catch((error) => { console.error(error); document.body.dataset.figures = "failed"; });
