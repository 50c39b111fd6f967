// A request's logger writes the lines pino's own child would, redaction included.
import { expect } from 'chai';
import { capturingLogger } from '../capture-log';
import { createLogger, requestLogger } from '../../infrastructure/log';

const capture = (level = 'debug') => capturingLogger(level);

const omitTime = ({ time: _t, ...rest }: Record<string, unknown>) => rest;

describe('request logger', () => {
  for (const id of ['0b7c1e9e-9d1a-4c2f-8f43-1a2b3c4d5e6f', 'trace-abc.123:x_Y', 'an id "with" \\ quotes\n']) {
    it(`writes what pino's child({ request_id }) writes, for the id ${JSON.stringify(id)}`, () => {
      const ours = capture();
      const theirs = capture();
      const write = (log: ReturnType<typeof createLogger>) => {
        log.info({ status: 200, authorization: 'Bearer sk-secret', nested: { apiKey: 'sk-secret' } }, 'request');
        log.warn('plain');
        log.child({ component: 'x' }).error({ key: 'sk-secret' }, 'grandchild');
      };
      write(requestLogger(ours.logger, id));
      write(theirs.logger.child({ request_id: id }));
      expect(ours.lines.map(omitTime)).to.deep.equal(theirs.lines.map(omitTime));
      expect(ours.lines).to.have.length(3);
      expect(ours.lines[0]).to.include({ request_id: id, authorization: '[redacted]', msg: 'request' });
      expect(ours.lines[2]).to.include({ request_id: id, component: 'x', key: '[redacted]' });
      expect(JSON.stringify(ours.lines)).to.not.include('sk-secret');
    });
  }

  it('leaves the parent without the binding', () => {
    const { lines, logger } = capture();
    requestLogger(logger, 'abc').info('child');
    logger.info('parent');
    expect(lines[0].request_id).to.equal('abc');
    expect(lines[1]).to.not.have.property('request_id');
  });
});
