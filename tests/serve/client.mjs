// `detvisor serve --http` with the official MCP TypeScript SDK
// (tests/serve.rs): lists the tools and makes one call.
// argv: URL TOKEN_FILE CAMPAIGN.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { readFileSync } from "node:fs";

const [url, tokenFile, campaign] = process.argv.slice(2);
const token = readFileSync(tokenFile, "utf8").trim();
const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${token}` } },
});
const client = new Client({ name: "detvisor-test", version: "0.0.0" });
await client.connect(transport);
const { tools } = await client.listTools();
const result = await client.callTool({ name: "findings", arguments: { campaign } });
if (result.isError) throw new Error(JSON.stringify(result));
const findings = result.structuredContent.findings;
if (!Array.isArray(findings) || findings.length === 0) throw new Error(JSON.stringify(result));
console.log(JSON.stringify({ tools: tools.map((t) => t.name), findings: findings.length }));
await client.close();
