// gRPC server reflection (grpc.reflection.v1, and v1alpha for the tools that still speak only it)
// from the descriptors protobuf-es generated: the same schema the adapter serves, so what tools
// discover is exactly what the server speaks. Answers list_services, file_by_filename and
// file_containing_symbol (each file with everything it imports); extensions are not used by
// Troupe's API and are answered as NOT_FOUND. The two versions' messages are the same on the
// wire; an answer is made as v1's and handed to v1alpha's callers as that.
import { create, fromBinary, toBinary, type DescFile, type DescMessage, type DescService } from "@bufbuild/protobuf";
import type { GenService, GenServiceMethods } from "@bufbuild/protobuf/codegenv2";
import { FileDescriptorProtoSchema } from "@bufbuild/protobuf/wkt";
import { Status } from "../shared/errors.js";
import {
  ServerReflection,
  ServerReflectionRequestSchema,
  ServerReflectionResponseSchema,
  type ServerReflectionRequest,
  type ServerReflectionResponse,
} from "../shared/gen/grpc/reflection/v1/reflection_pb.js";
import {
  ServerReflection as AlphaReflection,
  ServerReflectionRequestSchema as AlphaRequestSchema,
  ServerReflectionResponseSchema as AlphaResponseSchema,
} from "../shared/gen/grpc/reflection/v1alpha/reflection_pb.js";
import type { ServiceImpl } from "../shared/rpc.js";

class DescriptorIndex {
  readonly files = new Map<string, DescFile>();
  readonly symbols = new Map<string, DescFile>();

  constructor(readonly services: readonly DescService[]) {
    for (const s of services) this.addFile(s.file);
  }

  private addFile(file: DescFile): void {
    if (this.files.has(file.proto.name)) return;
    this.files.set(file.proto.name, file);
    const addMessage = (m: DescMessage) => {
      this.symbols.set(m.typeName, file);
      for (const e of m.nestedEnums) this.symbols.set(e.typeName, file);
      for (const n of m.nestedMessages) addMessage(n);
    };
    for (const m of file.messages) addMessage(m);
    for (const e of file.enums) this.symbols.set(e.typeName, file);
    for (const s of file.services) {
      this.symbols.set(s.typeName, file);
      for (const m of s.methods) this.symbols.set(`${s.typeName}.${m.name}`, file);
    }
    for (const dep of file.dependencies) this.addFile(dep);
  }

  /** The file and everything it imports, each once, imports first. */
  withImports(file: DescFile): Uint8Array[] {
    const out: DescFile[] = [];
    const visit = (f: DescFile) => {
      if (out.includes(f)) return;
      for (const d of f.dependencies) visit(d);
      out.push(f);
    };
    visit(file);
    return out.map((f) => toBinary(FileDescriptorProtoSchema, f.proto));
  }
}

function answer(index: DescriptorIndex, req: ServerReflectionRequest): ServerReflectionResponse {
  const res = create(ServerReflectionResponseSchema, { validHost: req.host, originalRequest: req });
  const notFound = (what: string) => {
    res.messageResponse = {
      case: "errorResponse",
      value: {
        $typeName: "grpc.reflection.v1.ErrorResponse",
        errorCode: Status.NOT_FOUND,
        errorMessage: `${what} not found`,
      },
    };
    return res;
  };
  const files = (file: DescFile | undefined, what: string) => {
    if (!file) return notFound(what);
    res.messageResponse = {
      case: "fileDescriptorResponse",
      value: { $typeName: "grpc.reflection.v1.FileDescriptorResponse", fileDescriptorProto: index.withImports(file) },
    };
    return res;
  };
  const r = req.messageRequest;
  switch (r.case) {
    case "listServices":
      res.messageResponse = {
        case: "listServicesResponse",
        value: {
          $typeName: "grpc.reflection.v1.ListServiceResponse",
          service: index.services.map((s) => ({ $typeName: "grpc.reflection.v1.ServiceResponse", name: s.typeName })),
        },
      };
      return res;
    case "fileByFilename":
      return files(index.files.get(r.value), `file ${r.value}`);
    case "fileContainingSymbol":
      return files(index.symbols.get(r.value.replace(/^\./, "")), `symbol ${r.value}`);
    case "fileContainingExtension":
      return notFound(`extension ${r.value.extensionNumber} of ${r.value.containingType}`);
    case "allExtensionNumbersOfType":
      return notFound(`extensions of ${r.value}`);
    default:
      res.messageResponse = {
        case: "errorResponse",
        value: {
          $typeName: "grpc.reflection.v1.ErrorResponse",
          errorCode: Status.INVALID_ARGUMENT,
          errorMessage: "empty reflection request",
        },
      };
      return res;
  }
}

/**
 * The reflection services (v1 and v1alpha) for a server that serves `services`, reflection
 * itself included. Add both: `server.add(ServerReflection, v1)`, `server.add(AlphaReflection, v1alpha)`.
 */
export function reflectionServices(services: readonly GenService<GenServiceMethods>[]): {
  v1: ServiceImpl<(typeof ServerReflection)["method"]>;
  v1alpha: ServiceImpl<(typeof AlphaReflection)["method"]>;
} {
  const index = new DescriptorIndex([...services, ServerReflection, AlphaReflection]);
  const v1: ServiceImpl<(typeof ServerReflection)["method"]> = {
    async *serverReflectionInfo(requests) {
      for await (const req of requests) yield answer(index, req);
    },
  };
  const v1alpha: ServiceImpl<(typeof AlphaReflection)["method"]> = {
    async *serverReflectionInfo(requests) {
      for await (const alpha of requests) {
        const req = fromBinary(ServerReflectionRequestSchema, toBinary(AlphaRequestSchema, alpha));
        yield fromBinary(AlphaResponseSchema, toBinary(ServerReflectionResponseSchema, answer(index, req)));
      }
    },
  };
  return { v1, v1alpha };
}
