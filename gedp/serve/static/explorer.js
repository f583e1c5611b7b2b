// The explorer page of `gedp serve`: every element is built with textContent (nothing a release
// or an answer holds is parsed as HTML) and every chart is SVG drawn here (nothing is fetched from
// elsewhere).
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const NAMES = {
  state: "State", county: "County", own: "Ownership", domain: "Domain", supersector: "Supersector",
  sector: "Sector", naics3: "NAICS 3", naics4: "NAICS 4", naics5: "NAICS 5", naics: "NAICS 6",
  m1emp: "Employment, month 1", m2emp: "Employment, month 2", m3emp: "Employment, month 3",
  wage: "Total quarterly wages", estabs: "Establishments", size_class: "Size class",
};
// QCEW aggregation level of a table by ownership: state 51-58, county 71-78 (+ the industry's offset).
const LEVEL_OFFSET = { "": 1, domain: 2, supersector: 3, sector: 4, naics3: 5, naics4: 6, naics5: 7, naics: 8 };
const SHOWN_ROWS = 500;
const CHART_ROWS = 30;
let releases = [];

function $(id) { return document.getElementById(id); }

function element(tag, text, className) {
  const made = document.createElement(tag);
  if (text !== undefined && text !== null) { made.textContent = String(text); }
  if (className) { made.className = className; }
  return made;
}

function svgElement(tag, attributes, text) {
  const made = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attributes)) { made.setAttribute(name, String(value)); }
  if (text !== undefined) { made.textContent = String(text); }
  return made;
}

function formatted(value) {
  if (value === null || value === undefined) { return ""; }
  if (typeof value !== "number") { return String(value); }
  return value.toLocaleString("en-US", { maximumFractionDigits: Math.abs(value) < 10 ? 1 : 0 });
}

function say(text, isError) {
  $("status").textContent = text;
  $("status").className = isError ? "error" : "";
}

async function getJson(url) {
  const response = await fetch(url, { headers: { Accept: "application/json" } });
  const body = await response.json();
  if (!response.ok) { throw new Error(body.error || response.statusText); }
  return body;
}

function chosenRelease() { return releases.find((r) => r.id === $("release").value); }

function quoted(text) { return "'" + text.replace(/'/g, "") + "'"; }

// The request of the form: the parameters of /api/tabulate (without format).
function request() {
  const release = chosenRelease();
  const by = [$("geography").value];
  if ($("industry").value) { by.push($("industry").value); }
  const ownership = $("ownership").value;
  if (ownership === "each") { by.push("own"); }
  if ($("size").value && release.size_classes) { by.push($("size").value); }
  const where = [];
  if (ownership !== "each" && ownership !== "all") { where.push("own == " + quoted(ownership)); }
  const code = $("code").value.trim();
  if (code) { where.push(($("industry").value || "sector") + " == " + quoted(code)); }
  const county = $("county").value.trim();
  if (county) { where.push("county == " + quoted(county)); }
  const params = new URLSearchParams({ release: release.id, by: by.join(","), moe: "1", level: $("level").value });
  if (where.length) { params.set("where", where.join(" and ")); }
  if (release.quarters.length) { params.set("quarter", $("quarter").value); }
  return params;
}

// The QCEW aggregation level the table is (null when it is none): tables by ownership, or the
// total over ownerships of all industries.
function qcewLevel() {
  if ($("size").value && chosenRelease().size_classes) { return null; }  // size classes: a table, not a level
  const base = $("geography").value === "county" ? 70 : 50;
  const ownership = $("ownership").value;
  if (ownership === "each") { return base + LEVEL_OFFSET[$("industry").value]; }
  if (ownership === "all" && !$("industry").value) { return base; }
  return null;
}

function fillReleases() {
  for (const release of releases) {
    const option = element("option", release.id + " (" + release.states.join(", ") + ", "
                           + formatted(release.establishments) + " establishments)");
    option.value = release.id;
    $("release").append(option);
  }
  releaseChosen();
}

function releaseChosen() {
  const release = chosenRelease();
  $("quarter").replaceChildren(...release.quarters.map((q) => { const o = element("option", q); o.value = q; return o; }));
  $("quarter-label").hidden = release.quarters.length === 0;
  const owns = [["all", "All ownerships (total)"], ["each", "Each ownership"],
                ...release.owns.map(([code, title]) => [code, "Only " + title])];
  $("ownership").replaceChildren(...owns.map(([value, text]) => { const o = element("option", text); o.value = value; return o; }));
  $("size-label").hidden = !release.size_classes;
  $("guarantee").textContent = release.guarantee;
  $("flags").replaceChildren(...Object.entries(release.flags).flatMap(([flag, meaning]) =>
    [element("dt", flag, "flag flag-" + flag), element("dd", meaning)]));
}

function keyColumns(answer) {
  return answer.columns.filter((c) => !["estabs", "m1emp", "m2emp", "m3emp", "wage"].includes(c)
                                       && !c.endsWith("_moe"));
}

// A row's label in a chart: the title of its last titled key (county, industry, ownership), else its codes.
function rowLabel(answer, i, keys) {
  const titled = keys.filter((k) => answer.titles[k] && k !== "state");
  return titled.length ? titled.map((k) => answer.titles[k][i]).join(" · ") : keys.map((k) => answer.rows[i][k]).join(" · ");
}

function showTable(answer, measure) {
  const keys = keyColumns(answer);
  const head = element("tr");
  for (const key of keys) { head.append(element("th", NAMES[key] || key)); }
  if (measure !== "estabs") { head.append(element("th", "Establishments")); }
  head.append(element("th", NAMES[measure]));
  const hasMargin = answer.columns.includes(measure + "_moe");
  if (hasMargin) {
    head.append(element("th", "± margin of error (" + Math.round(answer.level * 100) + "%)"));
    head.append(element("th", "Quality"));
  }
  $("table").tHead.replaceChildren(head);
  const rows = answer.rows.slice(0, SHOWN_ROWS).map((row, i) => {
    const line = element("tr");
    for (const key of keys) {
      const cell = element("td", answer.titles[key] ? answer.titles[key][i] : row[key]);
      cell.dataset.code = row[key];
      line.append(cell);
    }
    if (measure !== "estabs") { line.append(element("td", formatted(row.estabs), "number")); }
    line.append(element("td", formatted(row[measure]), "number"));
    if (hasMargin) {
      line.append(element("td", formatted(row[measure + "_moe"]), "number"));
      const flag = answer.flags[measure][i];
      line.append(element("td", flag, "flag flag-" + flag));
    }
    return line;
  });
  $("table").tBodies[0].replaceChildren(...rows);
  $("more").textContent = answer.rows.length > SHOWN_ROWS
    ? "The first " + SHOWN_ROWS + " of " + formatted(answer.rows.length) + " rows are shown; the CSV has them all."
    : formatted(answer.rows.length) + " rows.";
}

function barChart(answer, measure) {
  const keys = keyColumns(answer);
  const rows = answer.rows.slice(0, CHART_ROWS);
  const margin = (row) => (answer.columns.includes(measure + "_moe") ? row[measure + "_moe"] : 0);
  const low = Math.min(0, ...rows.map((r) => r[measure] - margin(r)));
  const high = Math.max(1, ...rows.map((r) => r[measure] + margin(r)));
  const width = 900, left = 290, barHeight = 16, gap = 6, top = 22;
  const height = top + rows.length * (barHeight + gap) + 10;
  const x = (value) => left + (value - low) / (high - low) * (width - left - 20);
  const chart = svgElement("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img",
                                    "aria-label": NAMES[measure] + " with margins of error" });
  chart.append(svgElement("text", { x: left, y: 14 }, NAMES[measure] + (answer.rows.length > CHART_ROWS
    ? " (the first " + CHART_ROWS + " rows)" : "") + "; the black lines are the margins of error"));
  rows.forEach((row, i) => {
    const y = top + i * (barHeight + gap);
    chart.append(svgElement("text", { x: left - 6, y: y + barHeight - 4, "text-anchor": "end" },
                            rowLabel(answer, i, keys).slice(0, 42)));
    const start = x(Math.min(0, row[measure])), end = x(Math.max(0, row[measure]));
    chart.append(svgElement("rect", { x: start, y, width: Math.max(1, end - start), height: barHeight, class: "bar" }));
    if (margin(row) > 0) {
      const mid = y + barHeight / 2;
      chart.append(svgElement("line", { x1: x(row[measure] - margin(row)), x2: x(row[measure] + margin(row)),
                                        y1: mid, y2: mid, class: "error" }));
      for (const end of [row[measure] - margin(row), row[measure] + margin(row)]) {
        chart.append(svgElement("line", { x1: x(end), x2: x(end), y1: mid - 4, y2: mid + 4, class: "error" }));
      }
    }
  });
  $("chart").replaceChildren(chart);
}

function lineChart(points, measure) {
  const width = 760, height = 240, left = 60, bottom = 30, top = 30;
  const low = Math.min(...points.map((p) => p.value - p.margin));
  const high = Math.max(...points.map((p) => p.value + p.margin));
  const span = high - low || 1;
  const x = (i) => left + (points.length === 1 ? 0.5 : i / (points.length - 1)) * (width - left - 90);
  const y = (v) => top + (1 - (v - low) / span) * (height - top - bottom);
  const chart = svgElement("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img",
                                    "aria-label": NAMES[measure] + " over the quarters" });
  chart.append(svgElement("text", { x: left, y: 12 }, NAMES[measure] + ", total of the selection in each quarter;"
                          + " the vertical lines are the margins of error"));
  chart.append(svgElement("polyline", { points: points.map((p, i) => `${x(i)},${y(p.value)}`).join(" "), class: "line" }));
  points.forEach((p, i) => {
    chart.append(svgElement("line", { x1: x(i), x2: x(i), y1: y(p.value - p.margin), y2: y(p.value + p.margin),
                                      class: "error" }));
    chart.append(svgElement("circle", { cx: x(i), cy: y(p.value), r: 4, class: "point" }));
    chart.append(svgElement("text", { x: x(i), y: height - 10, "text-anchor": "middle" }, p.quarter));
    chart.append(svgElement("text", { x: x(i) + 6, y: y(p.value) - 6 }, formatted(p.value)));
  });
  $("trend").replaceChildren(chart);
}

// A panel release: the total of the selection in each quarter, and its change from one quarter to
// the next, each with its margin of error.
async function showTrend(measure) {
  const release = chosenRelease();
  $("trend-part").hidden = release.quarters.length < 2 || measure === "estabs";
  if ($("trend-part").hidden) { return; }
  const base = request();
  base.set("by", "total");
  const points = [];
  for (const quarter of release.quarters) {
    base.set("quarter", quarter);
    const row = (await getJson("/api/tabulate?" + base)).rows[0];
    points.push({ quarter, value: row[measure], margin: row[measure + "_moe"] });
  }
  lineChart(points, measure);
  base.delete("quarter");
  const lines = [];
  for (let i = 1; i < release.quarters.length; i++) {
    base.set("change", release.quarters[i - 1] + ":" + release.quarters[i]);
    const row = (await getJson("/api/tabulate?" + base)).rows[0];
    const line = element("tr");
    line.append(element("td", release.quarters[i - 1] + " to " + release.quarters[i]),
                element("td", formatted(row[measure + "_chg"]), "number"),
                element("td", "± " + formatted(row[measure + "_chg_moe"]), "number"));
    lines.push(line);
  }
  $("changes").tBodies[0].replaceChildren(...lines);
}

async function show(event) {
  event.preventDefault();
  const measure = $("measure").value;
  const params = request();
  say("Computing…");
  try {
    const answer = await getJson("/api/tabulate?" + params);
    const release = chosenRelease();
    $("title").textContent = NAMES[measure] + " by " + keyColumns(answer).map((k) => NAMES[k] || k).join(", ")
      + (release.quarters.length ? ", " + $("quarter").value : "");
    showTable(answer, measure);
    barChart(answer, measure);
    const csv = new URLSearchParams(params);
    csv.set("format", "csv");
    $("download-csv").href = "/api/tabulate?" + csv;
    const level = qcewLevel();
    $("xlsx-part").hidden = level === null || release.quarters.length > 0;
    if (level !== null) {
      const xlsx = new URLSearchParams({ release: release.id, agglvl: level, moe: "1", level: $("level").value,
                                         format: "xlsx" });
      if (params.has("where")) { xlsx.set("where", params.get("where")); }
      $("download-xlsx").href = "/api/tabulate?" + xlsx;
    }
    $("result").hidden = false;
    await showTrend(measure);
    say(answer.warnings.length ? "Note: " + answer.warnings.join(" ") : "");
  } catch (error) {
    say(error.message, true);
  }
}

async function start() {
  try {
    releases = await getJson("/api/releases");
    fillReleases();
  } catch (error) {
    say("The releases could not be read: " + error.message, true);
  }
  $("release").addEventListener("change", releaseChosen);
  $("choices").addEventListener("submit", show);
}

start();
