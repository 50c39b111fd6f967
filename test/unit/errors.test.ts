// One table names each error status for the API documentation and for batch line results.
import { expect } from 'chai';
import { errorFromStatus, errorTypeOf, statusSummary } from '../../infrastructure/errors';
import { sizeText } from '../../infrastructure/errors/sizes';
import { ServiceError, WorkflowFailedError } from '@temporalio/client';
import { CancelledFailure, TerminatedFailure, TimeoutFailure, TimeoutType } from '@temporalio/common';
import { fromWorkflowFailure, wasStopped } from '../../infrastructure/temporal/failures';
import { normalize } from '../../api/errors';

describe('error names', () => {
  it('gives batch line errors the types their statuses mean, and falls back by class', () => {
    expect([402, 404, 429, 524, 529].map(errorTypeOf)).to.deep.equal([
      'insufficient_credits',
      'not_found',
      'rate_limited',
      'timeout',
      'overloaded',
    ]);
    expect([400, 401, 413, 418].map(errorTypeOf)).to.deep.equal(Array(4).fill('invalid_request'));
    expect([500, 502, 503, 599].map(errorTypeOf)).to.deep.equal(Array(4).fill('upstream_error'));
  });

  it('documents every status an error is rebuilt from', () => {
    for (const status of [400, 401, 402, 403, 404, 409, 413, 422, 429, 500, 502, 503, 524, 529]) {
      expect(errorFromStatus(status, 'x').status, String(status)).to.equal(status);
      expect(statusSummary(status), String(status)).to.be.a('string').and.not.equal('');
    }
    // Each its own words: a status missing from the table would read as its class's fallback, a duplicate.
    const statuses = [400, 401, 402, 403, 404, 409, 413, 422, 429, 500, 502, 503, 524, 529];
    expect(new Set(statuses.map(statusSummary)).size).to.equal(statuses.length);
    expect(statusSummary(402)).to.equal('Insufficient credits or storage quota');
  });
});

describe('sizes in messages', () => {
  it('name bytes in the largest unit they fill, to three significant digits', () => {
    const MB = 1024 ** 2;
    expect([512, 64 * 1024, 1.5 * MB, 33.33 * MB, 600 * MB, 9.95 * 1024 * MB, 10 * 1024 * MB].map(sizeText)).to.deep.equal([
      '512 bytes',
      '64 KB',
      '1.5 MB',
      '33.3 MB',
      '600 MB',
      '9.95 GB',
      '10 GB',
    ]);
  });
});

describe('errors as HTTP answers', () => {
  it('a Temporal that does not answer is a 503 to try again, not a 500 (a cancel signal while it was frozen: "Failed to signal Workflow: Timeout expired")', () => {
    // As the client threw it in that probe.
    const frozen = new ServiceError('Failed to signal Workflow', { cause: Object.assign(new Error('Timeout expired'), { code: 4 }) });
    expect(normalize(frozen)).to.include({ status: 503, message: 'The orchestration service is unavailable; try again' });
    expect(normalize(new Error('something else'))).to.include({ status: 500, message: 'Internal server error' });
  });
});

describe('workflow failures read back for clients', () => {
  const failed = (cause: Error) => new WorkflowFailedError('Workflow execution failed', cause, 'NON_RETRYABLE_FAILURE' as never);
  it('a run stopped from outside or timed out is a 503 saying which, not a 500', () => {
    for (const cause of [new TerminatedFailure('an operator'), new CancelledFailure('an operator')]) {
      const err = fromWorkflowFailure(failed(cause));
      expect(err.status, cause.name).to.equal(503);
      expect(err.message).to.equal('The run was stopped before it answered (terminated or cancelled in Temporal); try again');
      expect(wasStopped(failed(cause))).to.equal(true);
    }
    const timedOut = fromWorkflowFailure(failed(new TimeoutFailure('timed out', undefined, TimeoutType.START_TO_CLOSE)));
    expect([timedOut.status, timedOut.message]).to.deep.equal([503, 'The run did not finish in time; try again']);
    expect(wasStopped(failed(new TimeoutFailure('timed out', undefined, TimeoutType.START_TO_CLOSE)))).to.equal(false);
    // Anything else unexplained stays a 500.
    expect(fromWorkflowFailure(failed(new Error('a bug'))).status).to.equal(500);
  });
});
