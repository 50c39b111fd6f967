import { expect } from 'chai';
import { withFields } from '../../infrastructure/objects/with-fields';

describe('withFields: a copy with fields set, as a spread makes it', () => {
  it('copies the base, sets the fields over it (theirs win, in the spread’s key order) and leaves both unchanged', () => {
    const base = { model: 'a', messages: [{ role: 'user', content: 'hi' }], max_tokens: 16 };
    const fields = { stream: true, model: 'b' };
    const out = withFields(base, fields);
    expect(out).to.deep.equal({ ...base, ...fields });
    expect(Object.keys(out)).to.deep.equal(Object.keys({ ...base, ...fields }));
    expect(out).to.not.equal(base);
    expect(out.messages).to.equal(base.messages); // shallow, as a spread
    expect(base).to.deep.equal({ model: 'a', messages: [{ role: 'user', content: 'hi' }], max_tokens: 16 });
    expect(fields).to.deep.equal({ stream: true, model: 'b' });
  });

  it('keeps a parsed "__proto__" key as an own field, never as the copy’s prototype (Object.assign alone would set it)', () => {
    const parsed = JSON.parse('{"id":"x","__proto__":{"polluted":true}}');
    for (const out of [withFields(parsed, { model: 'm' }), withFields({ id: 'y' }, parsed)]) {
      expect(Object.getPrototypeOf(out)).to.equal(Object.prototype);
      expect((out as Record<string, unknown>).polluted).to.equal(undefined);
      expect(Object.hasOwn(out, '__proto__')).to.equal(true);
      expect(JSON.parse(JSON.stringify(out)).__proto__).to.deep.equal({ polluted: true });
    }
  });
});
