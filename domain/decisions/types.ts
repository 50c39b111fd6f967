// Types of the decision request and answers, from the schemas that validate them.
import type { Static } from '@sinclair/typebox';
import type { DecisionQuestion, DecisionAnswer, DecisionsRequestShape } from './schema';

export type Question = Static<typeof DecisionQuestion>;
export type Answer = Static<typeof DecisionAnswer>;
export type DecisionsRequest = Static<typeof DecisionsRequestShape>;
