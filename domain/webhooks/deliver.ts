// One delivery attempt of a signed webhook: POST, no redirects followed, bounded by a timeout.
// The outcome is returned, never thrown: whether and when to try again is the workflow's choice.
import { Agent, request } from 'undici';
import { guardedLookup, refusedAddress } from './address';
import { signWebhook } from './signature';

export interface DeliveryOutcome {
  ok: boolean;
  status: number | null;
  error: string | null;
}

export interface WebhookSender {
  send(target: { url: string; secret: string; id: string; body: string; timeoutMs: number }): Promise<DeliveryOutcome>;
  close(): Promise<void>;
}

export function createWebhookSender(allowPrivate: boolean): WebhookSender {
  // Fresh connections are checked by the guarded lookup; kept-alive ones were checked when made.
  const agent = new Agent({ connect: { lookup: guardedLookup(allowPrivate) }, keepAliveTimeout: 10_000 });
  return {
    async send({ url, secret, id, body, timeoutMs }) {
      // An address written in the URL is connected to without a lookup: checked here instead.
      const refused = refusedAddress(new URL(url), allowPrivate);
      if (refused) return { ok: false, status: null, error: `refused: ${refused} is a private, loopback or link-local address` };
      const timestamp = Math.floor(Date.now() / 1000);
      try {
        const res = await request(url, {
          method: 'POST',
          dispatcher: agent,
          signal: AbortSignal.timeout(timeoutMs),
          headers: {
            'content-type': 'application/json',
            'user-agent': 'inference-gateway-webhooks',
            'webhook-id': id,
            'webhook-timestamp': String(timestamp),
            'webhook-signature': signWebhook(secret, id, timestamp, body),
          },
          body,
        });
        await res.body.dump();
        const ok = res.statusCode >= 200 && res.statusCode < 300;
        return { ok, status: res.statusCode, error: ok ? null : `HTTP ${res.statusCode}` };
      } catch (err) {
        const e = err as { name?: string; code?: string; message?: string };
        const timedOut = e.name === 'TimeoutError' || e.name === 'AbortError';
        return {
          ok: false,
          status: null,
          error: timedOut ? `no answer within ${timeoutMs} ms` : (e.code ?? e.message ?? 'connection failed'),
        };
      }
    },
    close: () => agent.close(),
  };
}
