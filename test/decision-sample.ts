// One decision request's questions and state, shared by the unit and end-to-end decision tests.
export const questions = {
  urgent: { type: 'noul', instructions: 'Is this urgent?', criteria: { true: 'needs action today', false: 'can wait' } },
  topic: {
    type: 'choice',
    instructions: 'Which team?',
    criteria: { billing: null, bug: 'A defect in the product', account: { about: 'logins' } },
  },
  severity: { type: 'score', instructions: { ask: 'How severe is `ticket`?' }, criteria: ['none', 'minor', 'major', 'critical'] },
} as const;
export const state = { ticket: 'I was charged twice for my subscription', customer: { plan: 'pro' } };
