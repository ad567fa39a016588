// Opens dashboard pages in headless chromium (Debian's, driven by playwright-core) and prints
// one JSON report on stdout: per page its console and page errors, failed requests, the charts
// drawn (series per chart and inked canvas pixels), the trajectory viewer's stage colours,
// masked segments and heat-strip cells; a full-page screenshot of each page goes to OUT_DIR.
// Usage: node dashboard-check.mjs BASE_URL OUT_DIR PAGE_NAME=HASH [PAGE_NAME=HASH ...]
// The assertions live in the Rust tests that run this script; it only observes.
import { chromium } from "playwright-core";
import { mkdirSync } from "node:fs";
import { join } from "node:path";

const [base, outDir, ...specs] = process.argv.slice(2);
if (!base || !outDir || specs.length === 0) {
  console.error("usage: node dashboard-check.mjs BASE_URL OUT_DIR NAME=HASH...");
  process.exit(2);
}
mkdirSync(outDir, { recursive: true });
const executablePath = process.env.CHROMIUM_PATH || "/usr/bin/chromium";
const browser = await chromium.launch({ executablePath, args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"] });
const report = { pages: {} };
try {
  const context = await browser.newContext({ viewport: { width: 1400, height: 1000 } });
  const page = await context.newPage();
  let current = null;
  page.on("console", (m) => { if (current && (m.type() === "error" || m.type() === "warning")) current.console.push(`${m.type()}: ${m.text()}`); });
  page.on("pageerror", (e) => { if (current) current.errors.push(String(e)); });
  page.on("response", (r) => { if (current && r.status() >= 400) current.failed.push(`${r.status()} ${r.url()}`); });
  page.on("requestfailed", (r) => { if (current) current.failed.push(`failed ${r.url()}: ${r.failure()?.errorText}`); });
  for (const spec of specs) {
    const eq = spec.indexOf("=");
    const name = spec.slice(0, eq), hash = spec.slice(eq + 1);
    current = { hash, console: [], errors: [], failed: [] };
    report.pages[name] = current;
    const t0 = Date.now();
    // A fresh load per page, so every page's scripts and requests are observed from the start.
    await page.goto(`${base}/${hash}`, { waitUntil: "load" });
    await page.waitForFunction((h) => document.body.dataset.ready === h, hash, { timeout: 20000 })
      .catch((e) => current.errors.push(`page did not finish rendering: ${e.message}`));
    current.ms = Date.now() - t0;
    Object.assign(current, await page.evaluate(() => {
      const charts = [...document.querySelectorAll(".chart")].map((box) => {
        const canvas = box.querySelector("canvas");
        let inked = 0;
        if (canvas) {
          const d = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
          for (let i = 3; i < d.length; i += 4) if (d[i] > 0) inked++;
        }
        return {
          title: box.dataset.title,
          series: Number(box.dataset.series),
          points: Number(box.dataset.points),
          legend: box.querySelectorAll(".u-legend .u-series").length - 1,
          inked,
        };
      });
      const segs = [...document.querySelectorAll("#segments .seg")];
      const stageColors = {};
      for (const s of segs.filter((s) => s.dataset.kind === "model")) {
        stageColors[s.dataset.stage || "plan"] = getComputedStyle(s).borderLeftColor;
      }
      return {
        title: document.title,
        text: document.getElementById("main")?.innerText.slice(0, 4000) ?? "",
        errorText: [...document.querySelectorAll("#main .error")].map((e) => e.textContent),
        charts,
        registered: window.__charts || [],
        stageColors,
        maskedSegments: segs.filter((s) => s.classList.contains("masked")).length,
        maskedToolOutputs: segs.filter((s) => s.dataset.kind === "tool_output" && s.classList.contains("masked") && s.textContent.length > 0).length,
        heatCells: document.querySelectorAll("#heat > div").length,
        judgments: Math.max(0, document.querySelectorAll("#judgments tr").length - 1),
        links: [...document.querySelectorAll("#main a")].map((a) => a.getAttribute("href")).slice(0, 200),
      };
    }));
    const shot = join(outDir, `${name}.png`);
    await page.screenshot({ path: shot, fullPage: true });
    current.screenshot = shot;
  }
} finally {
  await browser.close();
}
process.stdout.write(JSON.stringify(report) + "\n");
