// How a client's operation reaches a provider of a given wire format: natively (the format serves
// it), or translated to an operation the format serves, with the answer and the stream translated
// back. OpenAI Chat Completions and Anthropic Messages reach each other's providers; OpenAI
// Responses reaches Messages providers through Chat Completions (translations compose). A new pair
// is a translation added here.
import { PROVIDER_FORMATS, type FormatName, type Operation } from '../formats';
import { chatAnswerToMessages, chatRequestToMessages, messagesAnswerToChat, messagesRequestToChat } from './chat-messages';
import { chatAnswerToResponses, chatToResponsesStream, responsesRequestToChat } from './chat-responses';
import { chatToMessagesStream, messagesToChatStream, type StreamTranslator } from './streams';

export type { StreamTranslator } from './streams';

type Json = Record<string, any>;

export interface Translation {
  /** The operation the provider is called with. */
  target: Operation;
  /** The request in the target's terms; parameters it cannot take are pushed to `dropped`. Throws a 400 for content it cannot carry. */
  request(body: Json, dropped: string[]): Json;
  /** The provider's answer in the client's terms. */
  answer(body: Json): Json;
  /** A translator for one stream, event by event. */
  stream(): StreamTranslator;
}

const TRANSLATIONS: Partial<Record<Operation, Translation>> = {
  // A Messages call to a Chat Completions provider.
  messages: { target: 'chat', request: messagesRequestToChat, answer: chatAnswerToMessages, stream: chatToMessagesStream },
  // A Chat Completions call to a Messages provider.
  chat: { target: 'messages', request: chatRequestToMessages, answer: messagesAnswerToChat, stream: messagesToChatStream },
  // A Responses call to a Messages provider, through Chat Completions.
  responses: {
    target: 'messages',
    request: (body, dropped) => chatRequestToMessages(responsesRequestToChat(body, dropped), dropped),
    answer: (body) => chatAnswerToResponses(messagesAnswerToChat(body)),
    stream: () => {
      const [toChat, toResponses] = [messagesToChatStream(), chatToResponsesStream()];
      return (event) => toChat(event).flatMap(toResponses);
    },
  },
};

/** Null when the format serves the operation itself, the translation when it serves it translated, undefined when not at all. */
export function translationFor(format: FormatName, operation: Operation): Translation | null | undefined {
  const paths = PROVIDER_FORMATS[format].paths;
  if (paths[operation]) return null;
  const t = TRANSLATIONS[operation];
  return t && paths[t.target] ? t : undefined;
}
