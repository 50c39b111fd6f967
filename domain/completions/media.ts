// Images and documents a request names by reference (a URL or a file id) rather than carrying: the
// provider fetches them and bills their tokens, which the body's own size does not show (a part of
// 60 bytes naming an image the provider counts as hundreds or thousands of tokens). Images carried
// inline (data: URLs, base64) are counted by their bytes like any other content.
type Part = Record<string, any>;

export interface ReferencedMedia {
  images: number;
  documents: number;
}

const byReference = (url: unknown) => typeof url === 'string' && !url.startsWith('data:');

function classify(p: Part, into: ReferencedMedia): void {
  switch (p.type) {
    case 'image_url': // OpenAI chat
      if (byReference(typeof p.image_url === 'string' ? p.image_url : p.image_url?.url)) into.images++;
      return;
    case 'input_image': // OpenAI responses
      if (byReference(p.image_url) || typeof p.file_id === 'string') into.images++;
      return;
    case 'image': // Anthropic messages
      if (p.source?.type === 'url' || p.source?.type === 'file') into.images++;
      return;
    case 'document':
      if (p.source?.type === 'url' || p.source?.type === 'file') into.documents++;
      return;
    case 'input_file':
      if (byReference(p.file_url) || typeof p.file_id === 'string') into.documents++;
      return;
    case 'file': // OpenAI chat
      if (typeof p.file?.file_id === 'string') into.documents++;
      return;
    case 'tool_result': // Anthropic: a tool's result may hold images and documents too
      if (Array.isArray(p.content)) for (const q of p.content) if (q && typeof q === 'object') classify(q, into);
  }
}

/** Each content part of the messages (chat, messages) or input items (responses) a request sends. */
function eachPart(body: Record<string, any>, visit: (p: Part) => void): void {
  const turns = Array.isArray(body.messages) ? body.messages : Array.isArray(body.input) ? body.input : [];
  for (const turn of turns) {
    if (!turn || typeof turn !== 'object') continue;
    // A responses input item may be a part itself, or a message holding parts.
    if (typeof turn.type === 'string' && turn.type !== 'message') visit(turn);
    if (Array.isArray(turn.content)) for (const p of turn.content) if (p && typeof p === 'object') visit(p);
  }
}

/** What the request names by reference. */
export function referencedMedia(body: Record<string, any>): ReferencedMedia {
  const found = { images: 0, documents: 0 };
  eachPart(body, (p) => classify(p, found));
  return found;
}

const IMAGE_PARTS = new Set(['image_url', 'input_image', 'image']);

/** The images a request's prompt holds, inline or by reference (a tool result's included): billed per image where the catalog gives an `image` price. */
export function imageCount(body: Record<string, any>): number {
  let n = 0;
  const count = (p: Part): void => {
    if (IMAGE_PARTS.has(p.type)) n++;
    else if (p.type === 'tool_result' && Array.isArray(p.content)) for (const q of p.content) if (q && typeof q === 'object') count(q);
  };
  eachPart(body, count);
  return n;
}

/**
 * Where a request sends audio (its first `input_audio` part) and where it asks for audio back
 * (`modalities` naming it, or `audio`): OpenAI bills audio tokens at many times its text prices, so
 * such a call goes only to endpoints the catalog gives audio prices. Null where it does not.
 */
export function audioFields(body: Record<string, any>): { input: string | null; output: string | null } {
  let input: string | null = null;
  const turns = Array.isArray(body.messages) ? body.messages : [];
  for (let i = 0; i < turns.length && !input; i++) {
    const parts = turns[i]?.content;
    if (!Array.isArray(parts)) continue;
    const j = parts.findIndex((p: Part) => p?.type === 'input_audio');
    if (j >= 0) input = `messages[${i}].content[${j}]`;
  }
  const output =
    Array.isArray(body.modalities) && body.modalities.includes('audio')
      ? 'modalities'
      : typeof body.audio === 'object' && body.audio !== null
        ? 'audio'
        : null;
  return { input, output };
}
