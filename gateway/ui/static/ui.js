// draftgate dashboard: sign-in, sign-out and the overview's live table (no dependencies).
"use strict";

async function postJSON(path, body) {
  const response = await fetch(path, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body),
    credentials: "same-origin",
  });
  const data = await response.json().catch(() => ({}));
  return { ok: response.ok, data };
}

function setUpLogin() {
  const form = document.getElementById("login");
  if (!form) return;
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const key = document.getElementById("key").value;
    const { ok, data } = await postJSON("/ui/login", { key });
    if (ok) {
      window.location.assign(data.next);
    } else {
      const message = data.error ? data.error.message : "sign-in failed";
      document.getElementById("login-error").textContent = message;
    }
  });
}

function setUpLogout() {
  const button = document.getElementById("logout");
  if (!button) return;
  button.addEventListener("click", async () => {
    await postJSON("/ui/logout", {});
    window.location.assign("/ui/login");
  });
}

function fillRow(row, values) {
  for (const cell of row.querySelectorAll("[data-k]")) {
    const key = cell.dataset.k;
    const value = values[key];
    if (key === "drafted_share") {
      const label = value === null ? "–" : Math.round(value * 100) + "%";
      cell.innerHTML = values.drafted_bar; // rendered and escaped by the gateway
      const span = document.createElement("span");
      span.textContent = " " + label;
      cell.appendChild(span);
    } else {
      cell.textContent = value === null ? "–" : String(value);
    }
  }
}

function newRow(table, values) {
  const template = table.tBodies[0].rows[0];
  const row = template.cloneNode(true);
  row.dataset.endpoint = values.endpoint;
  row.cells[0].textContent = values.endpoint;
  table.tBodies[0].appendChild(row);
  return row;
}

function setUpLive() {
  const table = document.getElementById("live");
  if (!table) return;
  async function refresh() {
    const response = await fetch(table.dataset.source, { credentials: "same-origin" });
    if (!response.ok) {
      document.getElementById("updated").textContent = "(refresh failed: " + response.status + ")";
      return;
    }
    const live = await response.json();
    for (const values of live.endpoints) {
      let row = null;
      for (const r of table.tBodies[0].rows) if (r.dataset.endpoint === values.endpoint) row = r;
      fillRow(row || newRow(table, values), values);
    }
    document.getElementById("chart-requests").innerHTML = live.charts.requests;
    document.getElementById("chart-tokens").innerHTML = live.charts.tokens;
    const at = new Date(live.generated_at * 1000);
    document.getElementById("updated").textContent = "Updated " + at.toLocaleTimeString() + ".";
  }
  refresh();
  window.setInterval(refresh, 2000);
}

function setUpAuditForm() {
  const form = document.getElementById("audit-form");
  if (!form) return;
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const body = {
      endpoint: form.elements.endpoint.value,
      categories: [...form.querySelectorAll("input[name=categories]:checked")].map((c) => c.value),
      concurrency: form.elements.concurrency.value.split(",").map((v) => v.trim())
        .filter((v) => v !== "").map(Number),
    };
    if (form.elements.requests.value !== "") body.requests = Number(form.elements.requests.value);
    if (form.elements.key) body.key = form.elements.key.value;
    const { ok, data } = await postJSON("/ui/audits", body);
    if (ok) {
      window.location.assign(data.next);
    } else {
      const message = data.error ? data.error.message : "the audit did not start";
      document.getElementById("audit-error").textContent = message;
    }
  });
}

function setUpAuditProgress() {
  const state = document.getElementById("audit-state");
  if (!state || state.dataset.state !== "running") return;
  const timer = window.setInterval(async () => {
    const response = await fetch("/ui/audit.json?id=" + encodeURIComponent(state.dataset.id), {
      credentials: "same-origin",
    });
    if (!response.ok) return;
    const run = await response.json();
    document.getElementById("audit-progress").value = run.answered;
    document.getElementById("audit-count").textContent = run.answered + "/" + run.total + " answered";
    if (run.state !== "running") {
      window.clearInterval(timer);
      window.location.reload();
    }
  }, 1000);
}

document.addEventListener("DOMContentLoaded", () => {
  setUpLogin();
  setUpLogout();
  setUpLive();
  setUpAuditForm();
  setUpAuditProgress();
});
