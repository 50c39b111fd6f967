// What the HTTP layer needs, passed in rather than reached through globals.
import type { Client } from '@temporalio/client';
import type { Config } from '../config';
import type { Logger } from '../log';
import type { Store } from '../store';

export interface AppDeps {
  config: Config;
  logger: Logger;
  store: Store;
  temporal: Client;
  pingTemporal: () => Promise<void>;
}
