// Who and what a billable call is attributed to, as its usage record keeps it: session, end user,
// the caller's trace metadata and app attribution. Read from a request by api/request-meta.

export interface RequestMeta {
  session_id: string | null;
  user: string | null;
  trace: Record<string, unknown> | null;
  app: { referer: string | null; title: string | null; categories: string[] };
}
