// Server-sent events read from an upstream body as it arrives. The body is only read while the
// events are being asked for, so a consumer that stops asking (a slow client) stops the reading,
// and TCP backpressure slows the provider down instead of the gateway buffering the stream.
import { createParser, type EventSourceMessage } from 'eventsource-parser';

export async function* sseEvents(body: AsyncIterable<Uint8Array>): AsyncGenerator<EventSourceMessage> {
  const ready: EventSourceMessage[] = [];
  const parser = createParser({ onEvent: (e) => ready.push(e) });
  const decoder = new TextDecoder();
  for await (const chunk of body) {
    parser.feed(decoder.decode(chunk, { stream: true }));
    while (ready.length) yield ready.shift()!;
  }
  parser.feed(decoder.decode());
  parser.reset({ consume: true }); // an event the upstream did not terminate with a blank line still counts
  while (ready.length) yield ready.shift()!;
}
