// The function tool the OpenAI-compatible faces' tests give their clients (openai-compat and
// openai-responses): get_weather, and the scripted model's prompt that calls it.
import { tool } from "@openai/agents";

export const WEATHER_PARAMETERS = {
  type: "object",
  properties: { city: { type: "string" } },
  required: ["city"],
  additionalProperties: false,
} as const;

/** A prompt the scripted model answers with one get_weather call for Oslo. */
export const ASKING_WEATHER = '!call get_weather {"city": "Oslo"}';

/** get_weather as an Agents SDK tool run in the test's process: it records each city asked for. */
export function weatherTool(cities: string[]) {
  return tool({
    name: "get_weather",
    description: "The weather in a city",
    parameters: WEATHER_PARAMETERS as never,
    strict: true,
    execute: async (args: unknown) => {
      const { city } = args as { city: string };
      cities.push(city);
      return `foggy in ${city}`;
    },
  } as never);
}
