// The baseline of bench/provider-sdk: the plain poster the provider SDKs replaced in the runner
// and the memory service (a JSON body POSTed with the key as a bearer token over the given fetch,
// a refusal read by the same `refusal` the SDKs' calls use). Kept here, not in the product, so the
// benchmark can say in one run what the SDKs cost.
import {
  type Fetch,
  type ProviderEndpoint,
  type ProviderPost,
  refusal,
} from "../../services/shared/models/provider-post.js";

const USER_AGENT = "troupe";

/** The headers every request to `endpoint` carries: its own, the key, who is asking. */
function endpointHeaders(endpoint: ProviderEndpoint): Record<string, string> {
  const headers: Record<string, string> = { ...endpoint.headers, "user-agent": USER_AGENT };
  if (endpoint.apiKey) headers.authorization = `Bearer ${endpoint.apiKey}`;
  return headers;
}

/** POSTs `body` as JSON to `path` under the endpoint, through `fetch`. Contract: ProviderPost's. */
export function providerPoster(endpoint: ProviderEndpoint, fetch: Fetch): ProviderPost {
  const base = endpoint.baseUrl.replace(/\/+$/, "");
  const headers = {
    ...endpointHeaders(endpoint),
    "content-type": "application/json",
    accept: "application/json, text/event-stream",
  };
  return async (path, body, signal) => {
    const response = await fetch(`${base}${path}`, { method: "POST", headers, body: JSON.stringify(body), signal });
    if (response.ok) return response;
    throw await refusal(response);
  };
}
