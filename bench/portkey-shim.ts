// Preloaded into the Portkey process only (`node --require`), so its streamed calls can be measured.
// Portkey 1.15.2 appends its own headers to the upstream `fetch` Response, and Node's fetch makes a
// Response's headers immutable: every streamed call through it failed with `TypeError: immutable`
// (a 500). A streamed answer gets a mutable copy of its headers; its body is not touched. Every
// other answer is passed through as it came.
const upstreamFetch = globalThis.fetch;

globalThis.fetch = async (...args: Parameters<typeof fetch>) => {
  const res = await upstreamFetch(...args);
  if (res.headers.get('content-type')?.startsWith('text/event-stream')) {
    Object.defineProperty(res, 'headers', { value: new Headers(res.headers) });
  }
  return res;
};
