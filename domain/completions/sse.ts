// Server-sent events read from an upstream body as it arrives. The body is only read while the
// events are being asked for, so a consumer that stops asking (a slow client) stops the reading,
// and TCP backpressure slows the provider down instead of the gateway buffering the stream.
import { createParser, type EventSourceMessage } from 'eventsource-parser';

/**
 * The events of `body`. One event may hold at most `maxEventBytes` (counted as the bytes read since
 * the last event): past that `tooLarge()` is thrown, instead of the parser holding a line that a
 * broken provider never ends.
 */
export async function* sseEvents(
  body: AsyncIterable<Uint8Array>,
  maxEventBytes: number,
  tooLarge: () => Error,
): AsyncGenerator<EventSourceMessage> {
  const ready: EventSourceMessage[] = [];
  const parser = createParser({ onEvent: (e) => ready.push(e) });
  const decoder = new TextDecoder();
  let pending = 0;
  for await (const chunk of body) {
    parser.feed(decoder.decode(chunk, { stream: true }));
    if (!ready.length) {
      pending += chunk.byteLength;
      if (pending > maxEventBytes) throw tooLarge();
      continue;
    }
    pending = 0;
    while (ready.length) yield ready.shift()!;
  }
  parser.feed(decoder.decode());
  parser.reset({ consume: true }); // an event the upstream did not terminate with a blank line still counts
  while (ready.length) yield ready.shift()!;
}
