// Workflow definitions. Deterministic code only: no I/O, clocks or randomness outside Temporal's APIs.
export { selfCheckWorkflow } from './self-check';
export { decisionWorkflow } from './decision';
export { batchWorkflow } from './batch';
