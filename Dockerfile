# One image for both roles: `gateway api` and `gateway worker` (see docker-compose.yml).
FROM node:20.19-bookworm-slim AS build
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --no-audit --no-fund
COPY . .
# The workflow bundle is built into the image (dist/.cache), so no container spends a second of CPU on webpack at start.
RUN npm run build && node -e "require('./dist/worker/bundle').workflowBundle()" && npm prune --omit=dev

FROM node:20.19-bookworm-slim
ENV NODE_ENV=production HOST=0.0.0.0 PORT=8080
WORKDIR /app
COPY --from=build /app/node_modules ./node_modules
COPY --from=build /app/dist ./dist
COPY --from=build /app/bin ./bin
COPY --from=build /app/domain/catalog/default.json ./domain/catalog/default.json
COPY package.json ./
# The API's usage journal (accounts/usage-journal) lives here: docker-compose mounts a volume on it.
ENV DATA_DIR=/var/lib/gateway
RUN mkdir -p /var/lib/gateway && chown node:node /var/lib/gateway
USER node
EXPOSE 8080
ENTRYPOINT ["node", "dist/cli/index.js"]
CMD ["api"]
