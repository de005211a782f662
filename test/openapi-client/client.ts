// A hotcount lookup client in TypeScript: the types are the ones
// openapi-typescript generates from pipeline/httpapi/openapi.yaml (schema.d.ts, next to
// this file once generated), the calls go through openapi-fetch. It is the
// generated client of another language that sidecar/openapi_ts_test.go
// (TestOpenAPITypeScriptClient) generates, compiles with tsc (strict: a
// type error fails the test) and runs against a sidecar.
//
//	HOTCOUNT_URL    the lookup listener's base URL (http://127.0.0.1:8080)
//	HOTCOUNT_TOKEN  its bearer token, if it has --http-token-file
//
// The arguments are topics, at least one: the first is read alone (its
// total, its count over 15m, its shards), all of them in one batch. It
// prints what it got as one JSON object on stdout, and fails (exit 1, the
// reason on stderr) on any answer other than the one it expects.
import createClient from "openapi-fetch";
import type { components, paths } from "./schema.js";

type Total = components["schemas"]["Total"];
type WindowCount = components["schemas"]["WindowCount"];
type ErrorBody = components["schemas"]["Error"];

// What the client prints.
interface Summary {
  total: Pick<Total, "topic" | "count" | "source" | "shards"> & { cacheControl: string | null };
  window: Pick<WindowCount, "topic" | "count" | "window" | "resolution">;
  batch: { topic: string; count: number }[];
  shards: { topic: string; count: number; sum: number; shards: number };
  trending: { window: string; topics: number; note: string | null };
  badRequest: { status: number; error: string };
  unauthorized: { status: number; error: string } | null;
}

function fail(what: string, status: number, error: ErrorBody | undefined): never {
  throw new Error(`${what}: status ${status}: ${error?.error ?? "no error body"}`);
}

async function main(): Promise<void> {
  const baseUrl = process.env["HOTCOUNT_URL"];
  if (!baseUrl) {
    throw new Error("HOTCOUNT_URL is not set");
  }
  const token = process.env["HOTCOUNT_TOKEN"] ?? "";
  const topics = process.argv.slice(2);
  const first = topics[0];
  if (first === undefined) {
    throw new Error("usage: client.js topic...");
  }
  const headers: Record<string, string> = token ? { Authorization: `Bearer ${token}` } : {};
  const client = createClient<paths>({ baseUrl, headers });

  // One topic's total: the answer is Total | WindowCount, and without a
  // window it must be a Total.
  const one = await client.GET("/v1/topics/{topic}", { params: { path: { topic: first } } });
  if (one.error !== undefined || one.data === undefined) {
    fail("total", one.response.status, one.error);
  }
  if ("window" in one.data) {
    throw new Error(`total: a windowed count without a window: ${JSON.stringify(one.data)}`);
  }
  const total: Total = one.data;

  // Its count over a window: a WindowCount.
  const win = await client.GET("/v1/topics/{topic}", {
    params: { path: { topic: first }, query: { window: "15m" } },
  });
  if (win.error !== undefined || win.data === undefined) {
    fail("window", win.response.status, win.error);
  }
  if (!("window" in win.data)) {
    throw new Error(`window: a total for a window: ${JSON.stringify(win.data)}`);
  }
  const windowed: WindowCount = win.data;

  // All the topics at once (?topic=a&topic=b), read now.
  const batch = await client.GET("/v1/topics", {
    params: { query: { topic: topics, consistency: "strong" } },
  });
  if (batch.error !== undefined || batch.data === undefined) {
    fail("batch", batch.response.status, batch.error);
  }

  // The first topic's shards, and their sum.
  const shards = await client.GET("/v1/topics/{topic}/shards", {
    params: { path: { topic: first }, query: { consistency: "strong" } },
  });
  if (shards.error !== undefined || shards.data === undefined) {
    fail("shards", shards.response.status, shards.error);
  }
  const shardSum = shards.data.shards.reduce((sum, s) => sum + s.count, 0);

  // The fleet's trending topics, with the default window.
  const trending = await client.GET("/v1/trending", { params: { query: { limit: 5 } } });
  if (trending.error !== undefined || trending.data === undefined) {
    fail("trending", trending.response.status, trending.error);
  }

  // A request the types allow and the sidecar refuses (a window takes no
  // consistency): 400, with the error body typed.
  const bad = await client.GET("/v1/topics/{topic}", {
    params: { path: { topic: first }, query: { window: "5m", consistency: "strong" } },
  });
  if (bad.response.status !== 400 || bad.error === undefined) {
    throw new Error(`bad request: status ${bad.response.status}, want 400 with an error body`);
  }
  const badError: string = bad.error.error;

  // Without the token, when there is one: 401, typed the same.
  let unauthorized: Summary["unauthorized"] = null;
  if (token) {
    const anonymous = createClient<paths>({ baseUrl });
    const denied = await anonymous.GET("/v1/topics/{topic}", { params: { path: { topic: first } } });
    if (denied.response.status !== 401 || denied.error === undefined) {
      throw new Error(`unauthorized: status ${denied.response.status}, want 401 with an error body`);
    }
    unauthorized = { status: denied.response.status, error: denied.error.error };
  }

  const summary: Summary = {
    total: {
      topic: total.topic,
      count: total.count,
      source: total.source,
      shards: total.shards,
      cacheControl: one.response.headers.get("Cache-Control"),
    },
    window: {
      topic: windowed.topic,
      count: windowed.count,
      window: windowed.window,
      resolution: windowed.resolution,
    },
    batch: batch.data.topics.map((t: Total | WindowCount) => ({ topic: t.topic, count: t.count })),
    shards: {
      topic: shards.data.topic,
      count: shards.data.count,
      sum: shardSum,
      shards: shards.data.shards.length,
    },
    trending: {
      window: trending.data.window,
      topics: trending.data.topics.length,
      note: trending.data.note ?? null,
    },
    badRequest: { status: bad.response.status, error: badError },
    unauthorized,
  };
  process.stdout.write(JSON.stringify(summary) + "\n");
}

main().catch((err: unknown) => {
  process.stderr.write(`${err instanceof Error ? err.message : String(err)}\n`);
  process.exitCode = 1;
});
