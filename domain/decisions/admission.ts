// What a decision request must be before any work starts: within the size limits (the state's
// own, Temporal's payload limit, since in workflow mode the request is the workflow's input, and
// what it sends upstream), and naming a decision model. Gives the estimate to hold against the
// workspace's credit.
import type { Catalog } from '../catalog';
import { BadRequestError, PayloadTooLargeError } from '../../infrastructure/errors';
import { estimateDecisionCost } from './estimate';
import { answeredNatively } from './evaluate';
import type { DecisionsRequest } from './types';

/** Temporal refuses payloads over 2 MB; in workflow mode the whole request is the workflow's input. */
const MAX_REQUEST_BYTES = 1.5 * 1024 * 1024;

/** The estimate of what the decision may cost; throws the 4xx that says why it cannot run. */
export function admitDecision(
  catalog: Catalog,
  body: DecisionsRequest,
  sizes: { requestBytes: number | undefined; maxStateBytes: number; maxPromptBytes: number },
): { estimate: number } {
  const stateBytes = Buffer.byteLength(typeof body.state === 'string' ? body.state : JSON.stringify(body.state));
  if (stateBytes > sizes.maxStateBytes)
    throw new PayloadTooLargeError(`state: is ${stateBytes} bytes, more than the limit of ${sizes.maxStateBytes}`);
  // The request's own length when the client sent one; measure only when it did not.
  const requestBytes = sizes.requestBytes ?? Buffer.byteLength(JSON.stringify(body));
  if (requestBytes > MAX_REQUEST_BYTES) throw new PayloadTooLargeError(`Decision request is larger than ${MAX_REQUEST_BYTES} bytes`);
  const { model } = catalog.resolve(body.model);
  if (model.kind !== 'decision') throw new BadRequestError(`model: ${model.id} is a ${model.kind} model, not a decision model`);
  // On chat endpoints the state goes out once per question: 256 questions on a 500 KB state sent
  // 128 MB of prompts, and a dozen such requests held the process's every turn for 25 s.
  const questions = Object.keys(body.questions).length;
  if (!answeredNatively(model) && stateBytes * questions > sizes.maxPromptBytes) {
    throw new PayloadTooLargeError(
      `state: ${model.id} is asked once per question, so its ${stateBytes}-byte state would be sent ${questions} times (${stateBytes * questions} bytes), more than the limit of ${sizes.maxPromptBytes}; send fewer questions per request or a smaller state`,
    );
  }
  return { estimate: estimateDecisionCost(model, { questions: body.questions, stateBytes }) };
}
