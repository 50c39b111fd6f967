// Reading server-sent events in tests: the raw text of a streamed answer, split into events.
export interface TestEvent {
  event: string | null;
  data: string;
  json: any;
}

/** Events of an SSE text, and the comment lines (keep-alives) it carried. */
export function parseSse(text: string): { events: TestEvent[]; comments: string[] } {
  const events: TestEvent[] = [];
  const comments: string[] = [];
  for (const block of text.split('\n\n')) {
    if (!block.trim()) continue;
    let event: string | null = null;
    const data: string[] = [];
    for (const line of block.split('\n')) {
      if (line.startsWith(':')) comments.push(line);
      else if (line.startsWith('event: ')) event = line.slice(7);
      else if (line.startsWith('data: ')) data.push(line.slice(6));
    }
    if (!data.length) continue;
    const joined = data.join('\n');
    let json: any = null;
    try {
      json = JSON.parse(joined);
    } catch {
      json = null;
    }
    events.push({ event, data: joined, json });
  }
  return { events, comments };
}

/** POSTs a streamed call and reads it to the end. */
export async function streamCall(url: string, key: string, body: unknown, headers: Record<string, string> = {}) {
  const res = await fetch(url, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json', ...headers },
    body: JSON.stringify(body),
  });
  const text = await res.text();
  return { status: res.status, headers: res.headers, text, ...parseSse(text) };
}
